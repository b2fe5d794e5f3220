"""What a launch reports: LaunchResult, and the ranks' output streams as one ordered text.

d2lpar/machinery/launch.py runs the processes; this module holds what they leave to read.
"""

import json
import os
import queue
from dataclasses import dataclass, field

_FORGIVEN_BIND = 'TORCHELASTIC_USE_AGENT_STORE is enabled so ignoring the error'


@dataclass
class LaunchResult:
    """What a launch did: exit status, each rank's output lines, results the ranks emitted."""

    returncode: int
    output: dict
    results: list
    timed_out: bool = False
    port: int = None
    commands: list = field(default_factory=list)  # the exact command of each started process
    elapsed: float = 0.0
    launch_id: str = ''
    exits: dict = field(default_factory=dict)  # {rank: {'how': 'error'|'stopped'|..., 'code', 'time'}}
    env: dict = field(default_factory=dict)  # what the launch changed in the environment (None: unset)

    @property
    def first_failure(self):
        """Return the rank that failed first (None if none did).

        When one rank fails, torchrun stops the others, which may then never
        report their own error: look for the cause in this rank's output.
        """
        errors = [(e['time'], rank) for rank, e in self.exits.items() if e['how'] == 'error']
        if errors:
            return min(errors)[1]
        return _root_cause_rank(self.output.get('torchrun', []))

    @property
    def ok(self):
        """Return True when every process exited with status 0 in time."""
        return self.returncode == 0 and not self.timed_out

    def by_rank(self, key=None):
        """Return {rank: last result of that rank} (or of its field `key`)."""
        table = {}
        for record in self.results:
            table[record['rank']] = record if key is None else record[key]
        return dict(sorted(table.items()))

    def text(self):
        """Return all output as prefixed lines, ranks first, then the launcher's streams."""
        return '\n'.join(
            f'[{_label(name)}] {line}' for name in _stream_order(self.output) for line in self.output[name]
        )

    def check(self):
        """Raise RuntimeError with the output if the launch failed; return self otherwise."""
        if not self.ok:
            why = 'timed out' if self.timed_out else f'exited with status {self.returncode}'
            first = self.first_failure
            if first is not None:
                why += f' (rank {first} failed first)'
            tail = '\n'.join(
                f'[{_label(name)}] {line}' for name in _stream_order(self.output) for line in self.output[name][-15:]
            )
            what = self.commands[0] if self.commands else 'nothing started'
            raise RuntimeError(f'launch {why}: {what}\n(last lines of each stream)\n{tail}')
        return self


def _root_cause_rank(lines):
    """Return the rank torchrun names as 'Root Cause (first observed failure)', or None."""
    after = False
    for line in lines:
        after = after or 'Root Cause' in line
        words = line.split()
        if after and len(words) >= 3 and words[0] == 'rank' and words[1] == ':':
            return int(words[2]) if words[2].isdigit() else None
    return None


def _stream_name(stem):
    """Return the stream a shim file stem names: the rank as an int ('rank3' -> 3), else the stem."""
    return int(stem[4:]) if stem.startswith('rank') and stem[4:].isdigit() else stem


def _label(name):
    return f'rank {name}' if isinstance(name, int) else name


def _stream_order(output):
    ranks = sorted(k for k in output if isinstance(k, int))
    return ranks + sorted(k for k in output if not isinstance(k, int))


def _internal_frame(line):
    """Return True for the lines of a Python traceback other than its last (the error)."""
    return line.startswith(('Traceback (most recent call last)', '  File "', '    ')) or not line.strip('^~ ')


class _Streams:
    """Collect output lines per stream and echo them, prefixed, from the calling thread."""

    def __init__(self, log_dir, echo):
        self.log_dir, self.echo = log_dir, echo
        self.output, self.queue = {}, queue.Queue()
        self.offsets, self.partial = {}, {}

    def add(self, name, line):
        if _FORGIVEN_BIND in line:  # expected: the launcher hosts the store (_loopback_store)
            return
        self.output.setdefault(name, []).append(line)
        if self.echo and not (isinstance(name, str) and _internal_frame(line)):
            print(f'[{_label(name)}] {line}', flush=True)

    def read_pipe(self, name, pipe):
        """Thread body: queue every line of an agent's pipe."""
        for raw in iter(pipe.readline, b''):
            self.queue.put((name, raw.decode(errors='replace').rstrip('\r\n')))
        pipe.close()

    def pump(self, final=False):
        while True:
            try:
                self.add(*self.queue.get_nowait())
            except queue.Empty:
                break
        for entry in sorted(os.listdir(self.log_dir)):
            stem = entry[: -len('.log')]
            name = _stream_name(stem)
            with open(os.path.join(self.log_dir, entry), 'rb') as f:
                f.seek(self.offsets.get(entry, 0))
                data = f.read()
            self.offsets[entry] = self.offsets.get(entry, 0) + len(data)
            text = self.partial.pop(entry, b'') + data
            *lines, rest = text.split(b'\n')
            for raw in lines:
                self.add(name, raw.decode(errors='replace').rstrip('\r'))
            if rest and final:
                self.add(name, rest.decode(errors='replace'))
            elif rest:
                self.partial[entry] = rest


def _collect_results(result_dir):
    records = []
    for entry in os.listdir(result_dir):
        if entry.endswith('.json'):
            rank, stamp, _ = entry[:-5].split('-', 2)
            with open(os.path.join(result_dir, entry)) as f:
                records.append(((int(rank), int(stamp)), json.load(f)))
    return [record for _, record in sorted(records, key=lambda item: item[0])]


def _collect_exits(exit_dir):
    exits = {}
    if os.path.isdir(exit_dir):
        for entry in os.listdir(exit_dir):
            if entry.endswith('.json'):
                stem = entry[:-5]
                name = _stream_name(stem)
                with open(os.path.join(exit_dir, entry)) as f:
                    exits[name] = json.load(f)
    return exits
