"""The mutant record and the loader that gathers every notebook's MUTANTS.

A mutant is one small, named change to the code a check exists to guard (a saved
cell, a script, a package function), tied to the check that must catch it.
`verify/mutants/nbNN_<name>.py`, named as the notebook (which lets git follow the file when
notebooks are renumbered), holds the mutants of notebook NN as `MUTANTS = [...]`;
`nb_launch_cleanup.py` holds those of the last cell that every launching notebook shares.
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Mutant:
    """One planted bug and the check that must catch it.

    name: short, unique, kebab-case. notebook: e.g. '08_lenet_data_parallel'.
    claim: the claim in a few words. target: repo-relative file to change (a
    notebook or any file). old, new: exact text; in a notebook, replaced inside
    one code cell; it must occur exactly once in the file. catch: text of the
    notebook cell that must fail, or the test node id that must fail when `run`
    is given. run: a pytest node id or path to run instead of the notebook.
    quick: part of the fast subset CI runs. gpus: the CUDA GPUs torch must see for the
    catching check to run at all (its cell's CPU branch checks something else); on a machine
    with fewer, the runner reports the mutant as NEEDS-GPU instead of running it. cores: the
    numbers of usable cores on which the catching check runs at all (a branch that depends on
    them, e.g. DataLoader workers only from 4 cores); elsewhere the row reads OTHER-CORES.
    """

    name: str
    notebook: str
    claim: str
    target: str
    old: str
    new: str
    catch: str
    run: str | None = None
    quick: bool = False
    gpus: int = 0
    cores: range | None = None


def unnamed_allowed(folder=HERE):
    """Return {notebook: [first line, ...]} of the checks each nbNN_<notebook>.py lists in UNNAMED_CHECKS.

    Those are the checks no mutant names yet (`run.py --unnamed` finds them): a known gap, kept
    in view, that may only shrink; a new check without its mutant fails tests/test_mutants.py.
    """
    return {
        path.stem[len('nb') :]: list(getattr(module, 'UNNAMED_CHECKS', ()))
        for path, module in modules(folder, 'nb[0-9][0-9]_*.py')
    }


def modules(folder, pattern):
    """Yield (path, module) of each file of `folder` matching `pattern`, in name order, freshly loaded."""
    for path in sorted(Path(folder).glob(pattern)):
        spec = importlib.util.spec_from_file_location(f'_mutants_{path.stem}', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield path, module


def load(folder=HERE):
    """Return every MUTANTS entry of `folder`/nb*.py, in notebook order; names must be unique."""
    found, seen = [], {}
    for path, module in modules(folder, 'nb*.py'):
        for mutant in getattr(module, 'MUTANTS', ()):
            if not isinstance(mutant, Mutant):
                raise TypeError(f'{path.name}: MUTANTS holds {mutant!r}, not a Mutant')
            if mutant.name in seen:
                raise ValueError(
                    f'mutant name {mutant.name!r} is used in {seen[mutant.name]} and {path.name}; names must be unique'
                )
            seen[mutant.name] = path.name
            found.append(mutant)
    return found
