"""Normalize the course's notebooks so that a diff shows only what changed (`make normalize`).

    python d2lpar/tools/notebooks.py [NOTEBOOK ...]          # rewrite those that differ
    python d2lpar/tools/notebooks.py --check [NOTEBOOK ...]  # exit 1 and name them

Outputs and execution counts go (notebooks are committed without them); every cell keeps the
id it has, and a cell without one gets an id made from its position and source, so the same
notebook always normalizes to the same text; the JSON is written as the files are kept
(one-space indent, UTF-8 as is), whole or not at all. Needs only the standard library.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

try:  # the atomic writer of d2lpar/machinery/saving.py, loaded by path as make lib loads it
    from .lib import write_whole
except ImportError:  # run by path: this folder is sys.path[0]
    from lib import write_whole

ROOT = Path(__file__).resolve().parents[2]


def normalized(text):
    """Return the normalized text of a notebook given as JSON text."""
    nb = json.loads(text)
    taken = {cell['id'] for cell in nb['cells'] if cell.get('id')}
    for index, cell in enumerate(nb['cells']):
        if cell['cell_type'] == 'code':
            cell['outputs'], cell['execution_count'] = [], None
        if not cell.get('id'):
            source = ''.join(cell.get('source', ''))
            digest = hashlib.sha256(f'{index}\0{source}'.encode()).hexdigest()
            new = next(digest[i : i + 8] for i in range(0, 56) if digest[i : i + 8] not in taken)
            cell['id'] = new
            taken.add(new)
    if nb.get('nbformat', 4) == 4 and nb.get('nbformat_minor', 0) < 5:
        nb['nbformat_minor'] = 5  # cell ids need 4.5; older minors make Jupyter invent new ones
    return json.dumps(nb, indent=1, ensure_ascii=False) + '\n'


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python d2lpar/tools/notebooks.py', description=__doc__.split('\n')[0])
    parser.add_argument('--check', action='store_true', help='only name the notebooks that differ (exit 1)')
    parser.add_argument('notebooks', nargs='*', type=Path, help='default: every notebook under notebooks/')
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / 'notebooks').glob('**/*.ipynb'))
    differ = []
    for path in paths:
        if '.ipynb_checkpoints' in path.parts:
            continue
        text = path.read_text(encoding='utf-8')
        new = normalized(text)
        if new != text:
            differ.append(path)
            if not args.check:
                write_whole(path, new)
            print(f'{path}: {"not normalized" if args.check else "normalized"}')
    return 1 if args.check and differ else 0


if __name__ == '__main__':
    sys.exit(main())
