"""Where a benchmark leaves its numbers: bench-results/NAME.json and NAME.png, each whole or not at all."""

import json
from pathlib import Path

from d2lpar.machinery.saving import replace_whole, write_whole

RESULTS = Path(__file__).resolve().parent.parent / 'bench-results'


def save(name, record, fig, folder=RESULTS):
    """Write `record` to folder/NAME.json and `fig` to folder/NAME.png; return both paths.

    Each file is replaced atomically: a run that fails while writing (a full disk, Ctrl-C)
    leaves the previous run's file as it was, never half of a new one.
    """
    folder = Path(folder)
    folder.mkdir(exist_ok=True)
    data, picture = folder / f'{name}.json', folder / f'{name}.png'
    write_whole(data, json.dumps(record, indent=1))
    replace_whole(picture, lambda tmp: fig.savefig(tmp, format='png', dpi=100))
    print(f'saved {data} and {picture}')
    return data, picture
