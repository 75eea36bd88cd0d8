"""How much of the machine ``agentkv demo`` needs, checked before anything starts.

The demo's HBM arena lives in host memory here, next to the host pool and a local Ray,
and each session holds a connection: a workload too large for the machine is refused in
one line naming the flag at fault (``check_fits``), not found out minutes into the run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentkv_cluster.cli import CliError

DEMO_PAGE_BYTES = 1 << 20  # one HBM arena page
DEMO_ARENA_PAGES = 96  # the arena of the default workload (8 sessions); more follow the budget
DEMO_POOL_BYTES = 256 << 20  # the host pool's shared memory
DEMO_OVERHEAD_BYTES = 1 << 30  # a local Ray with its workers, the service and the clients
FDS_PER_SESSION = 4  # a session's client socket, its server end, and room for redials
FDS_BASE = 512  # Ray, NIXL, the pool, logs


def hbm_capacity(spec: Any, budget: float) -> tuple[Any, int]:
    """The demo service's HBM budget: ``budget`` of the workload's working set, at least
    two whole sessions, both counted as the service charges them (whole arena pages of
    ``DEMO_PAGE_BYTES``). Returns the spec with that charge set, and the capacity."""
    from dataclasses import replace

    spec = replace(spec, charge_bytes=DEMO_PAGE_BYTES)
    floor = 2 * spec.largest_session()
    if spec.episodes:  # and one synthetic warm-up session (``_warm_up``) must fit
        floor = max(floor, warmup_spec(spec).largest_session())
    return spec, max(int(budget * spec.working_set()), floor)


def warmup_spec(spec: Any) -> Any:
    """The warm-up's quick round of ``spec``: synthetic sessions (never a trace's own, which
    would teach AgentKV the measured sessions), one quick tool call each."""
    from dataclasses import replace

    return replace(spec, turns=1, stagger_s=0.0, tool_plan=((("warmup", 0.05),),),
                   episodes=None)


def arena_pages(capacity: int) -> int:
    """HBM arena pages for a budget of ``capacity`` bytes: the budget in whole pages, and
    never fewer than the 96 the default workload was tuned with."""
    return max(DEMO_ARENA_PAGES, -(-capacity // DEMO_PAGE_BYTES))


@dataclass(frozen=True)
class Machine:
    """What the demo needs from the machine it runs on."""

    mem_available: int  # bytes the kernel can hand out without swapping (MemAvailable)
    open_files: int  # this process's soft limit on open files, after raising it to the hard one

    def holds(self, spec: Any, capacity: int) -> bool:
        """Whether a demo of ``spec`` with HBM budget ``capacity`` fits (``demo_needs``)."""
        memory, files = demo_needs(spec, capacity)
        return memory <= self.mem_available and files <= self.open_files


def demo_needs(spec: Any, capacity: int) -> tuple[int, int]:
    """Memory (bytes) and open files a demo of ``spec`` with HBM budget ``capacity`` needs:
    its arena (host memory here), the pool, and a local Ray; a connection per session."""
    memory = arena_pages(capacity) * DEMO_PAGE_BYTES + DEMO_POOL_BYTES + DEMO_OVERHEAD_BYTES
    return memory, FDS_BASE + FDS_PER_SESSION * spec.sessions


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest ``n`` in ``1..high`` for which ``fits(n)`` (true up to some ``n``, false
    above it), by bisection; 0 when none does."""
    low = 0
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def check_fits(spec: Any, capacity: int, machine: Machine, budget: float) -> None:
    """Refuse, before anything starts, a demo this machine cannot hold, naming the flag at
    fault and the largest value of it that fits (synthetic workloads only: a trace's
    sessions are its own): ``--sessions`` while fewer sessions fit, else ``--turns`` (one
    session of that many turns alone is too large)."""
    if machine.holds(spec, capacity):
        return
    memory, files = demo_needs(spec, capacity)
    what = (f"an HBM arena, pool and local Ray of {memory / 2**30:.1f} GiB, "
            f"{machine.mem_available / 2**30:.1f} GiB available"
            if memory > machine.mem_available else
            f"{files} open files, the limit is {machine.open_files}")
    flag, hint = f"--sessions {spec.sessions}", ""
    if not spec.episodes:
        from dataclasses import replace

        def holds(**change: int) -> bool:
            return machine.holds(*hbm_capacity(replace(spec, **change), budget))

        sessions = _largest(lambda n: holds(sessions=n), spec.sessions)
        turns = 0 if sessions else _largest(lambda n: holds(turns=n), spec.turns)
        alone = 0 if sessions or turns else _largest(lambda n: holds(sessions=1, turns=n),
                                                     spec.turns)
        if sessions:
            hint = f"; at most --sessions {sessions} fits"
        elif turns:
            flag = f"--turns {spec.turns}"
            hint = f"; at most --turns {turns} fits with --sessions {spec.sessions}"
        elif alone:
            flag = f"--turns {spec.turns} with --sessions {spec.sessions}"
            hint = f"; at most --turns {alone} fits, with --sessions 1"
        else:
            hint = "; not even one session of one turn fits"
    raise CliError(f"{flag} needs {what}{hint}")


def this_machine() -> Machine:
    """MemAvailable from /proc/meminfo (free physical pages elsewhere), and the open-file
    limit after raising the soft limit to the hard one, as servers do."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return Machine(mem_available=available,
                   open_files=soft if soft != resource.RLIM_INFINITY else 1 << 30)
