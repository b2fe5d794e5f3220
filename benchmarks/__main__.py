"""Run every benchmark: `python -m benchmarks [--quick]` (or `make bench`).

Each module in this folder with a `main(quick)` function is one benchmark. They
print ratios measured side by side in one run; nothing here asserts a speed.
"""

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m benchmarks', description=__doc__)
    parser.add_argument('--quick', action='store_true', help='fewer repetitions, smaller sizes')
    parser.add_argument('names', nargs='*', help='benchmarks to run (default: all)')
    args = parser.parse_args(argv)
    available = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith('_'))
    unknown = set(args.names) - set(available)
    if unknown:
        parser.error(f'unknown benchmark(s) {sorted(unknown)}; choose from {available}')
    import d2lpar

    d2lpar.show_setup()
    for name in args.names or available:
        print(f'\n=== benchmarks.{name} ===', flush=True)
        importlib.import_module(f'benchmarks.{name}').main(quick=args.quick)
    return 0


if __name__ == '__main__':
    sys.exit(main())
