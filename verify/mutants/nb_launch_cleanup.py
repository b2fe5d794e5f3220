"""Planted bugs for the last cell of every notebook that launches ranks: nothing is left behind.

Each such notebook ends by checking that its launches left no process running and no port
taken. What that cell guards is `d2lpar.launch`'s clean-up, so the bugs are planted there, one
mutant per notebook, each caught by that notebook's last cell.
"""

from verify.mutants.registry import Mutant

LAUNCH = 'd2lpar/machinery/launch.py'

# The launch's rendezvous store closed in the background, long after the launch returned:
# its port stays taken, and the next launch that asks for it fails.
STORE_CLOSED = '                stores.clear()  # closes the store and its port: it lives no longer than the launch\n'
STORE_CLOSED_LATER = (
    '                later = threading.Timer(600, stores.clear)  # closed in the background, later\n'
    '                later.daemon = True\n'
    '                later.start()\n'
)

PORTS_CHECKED = {
    '10_zero': 'assert d2lpar.launched_processes() == [] and d2lpar.port_is_free(run.port), run.port',
    '11_fsdp2': 'assert d2lpar.launched_processes() == [] and d2lpar.port_is_free(run.port), run.port',
    '12_tensor_parallel': 'assert leftovers == [] and all(d2lpar.port_is_free(port) for port in ports), ports',
    '13_tensor_parallel_dtensor': 'assert leftovers == [] and all(d2lpar.port_is_free(port) for port in ports), ports',
    '15_context_expert': 'assert leftovers == [] and all(d2lpar.port_is_free(port) for port in ports), ports',
    '16_fault_tolerance': 'assert leftovers == [] and all(d2lpar.port_is_free(r.port) for r in launches)',
    '17_reasoning_at_scale': 'assert leftovers == [] and d2lpar.port_is_free(fit_run.port), fit_run.port',
    '18_capstone': 'assert leftovers == [] and all(d2lpar.port_is_free(port) for port in ports), ports',
}

MUTANTS = [
    Mutant(
        f'launch-store-closed-later-{nb[:2]}',
        nb,
        "the launches leave no port taken",
        LAUNCH,
        old=STORE_CLOSED,
        new=STORE_CLOSED_LATER,
        catch=catch,
    )
    for nb, catch in PORTS_CHECKED.items()
]
