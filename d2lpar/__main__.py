"""Command line: `python -m d2lpar info` prints a report on this machine."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m d2lpar', description='Tools of the d2lpar course.')
    sub = parser.add_subparsers(dest='command', required=True)
    sub.add_parser('info', help='print torch/CUDA versions, GPUs, backends and CPU count')
    from .machinery.render import add_arguments
    from .machinery.render import run as render_html

    add_arguments(
        sub.add_parser('html', help='execute every notebook and render the course as a static site in build/html')
    )
    args = parser.parse_args(argv)
    if args.command == 'info':
        from .machinery.info import report

        print(report())
    if args.command == 'html':
        return render_html(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
