"""`make hosts`: ckptbench across two hosts, on one machine, as root.

    .venv/bin/python scripts/hosts.py -- run configs/hosts.yaml -o results
    .venv/bin/python scripts/hosts.py --nproc-per-host 2 --host-set 1:max_write_bw=50MiB/s \\
        -- run configs/hosts.yaml -o results          # host 1 capped: a planted straggler

Each host is a network namespace, joined to the other by a veth pair (198.18.0.1 and 198.18.0.2,
the benchmarking range of RFC 2544, inside the namespaces only: nothing is routed outside them),
and runs under its own UTS namespace (hostname `host0`, `host1`, resolved by an /etc/hosts of its
own) and mount namespace, in which its own loop device, formatted ext4, is mounted at the same
path as the other host's: each host has its own block device (its own counters in
/sys/block/loopN/stat, its own page cache to drop) behind the same target paths, so both run the
same config. Its targets are `scratch` on that disk (`--set scratch=DISK` is added to the
command). One torchrun agent per host (`--nproc-per-host` ranks each) meets the other in a c10d
rendezvous on host 0 over the veth; gloo talks over it too (GLOO_SOCKET_IFNAME).

Everything after `--` is what each agent runs as `-m bench ...`, then `--host-set I:KEY=VALUE`
for host I alone (a target's cap, its scratch: a host may differ in targets and scratch only).

Every name is made unique per invocation (`--tag`, default from the process id), and only what
this invocation made is removed: on exit, on Ctrl-C or SIGTERM (the agents are interrupted, then
killed), and on failure. A SIGKILL of this script leaves its namespaces and loop devices behind:
`--clean TAG` removes those of a tag. Needs root, `ip` (iproute2), `unshare` and `losetup`
(util-linux), `mkfs.ext4` (e2fsprogs) and a kernel with loop devices; nothing is installed.

Exit code: 2 when every host refused the run (a user error; its one line is printed last) or
the rendezvous never formed (its timeout named), else rank 0's (host 0's) exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import IO

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import sizes  # noqa: E402

SUBNET = "198.18.0"  # RFC 2544's benchmarking range, inside the namespaces only
IFNAME = "ckveth"  # the veth's name inside each namespace (each namespace has its own names)
PORT = 29400  # the rendezvous, on host 0's address (a port of the namespace, not the machine's)
TAG_PREFIX = "ckh"
RC_FILE_ENV = "CKPTBENCH_RC_FILE"  # bench.run.launch: a node's first rank leaves its exit code
STOP_GRACE_S = 20.0  # after Ctrl-C, how long the agents get to end their ranks before SIGKILL
# What each host runs inside its namespaces before the agent: its name, its disk, its names.
# The new mount namespace starts with a copy of every mount the machine had: a loop device
# mounted there by someone else (another test's disk) would stay busy while the agent runs, and
# its owner's `losetup -d` would not free it. The copies of loop mounts are let go first (in this
# namespace only), then the host's own disk is mounted.
ENTER = (
    'set -e; name=$1 dev=$2 mnt=$3 hosts=$4; shift 4; hostname "$name"; '
    "for m in $(awk '$1 ~ /^[/]dev[/]loop/ {print $2}' /proc/self/mounts | sort -r); do "
    'umount -l "$m" 2>/dev/null || true; done; '
    'mount "$dev" "$mnt"; mount --bind "$hosts" /etc/hosts; exec "$@"'
)


class Refused(Exception):
    """This machine cannot host the namespaces (not root, a tool missing): one line, exit 2."""


def requirements() -> str | None:
    """Why the hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, loop devices and mounts)"
    for tool in ("ip", "unshare", "losetup", "mkfs.ext4", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH"
    if not os.path.exists("/dev/loop-control"):
        return "needs loop devices (/dev/loop-control is missing)"
    return None


def _sh(*cmd: str) -> str:
    """Run a setup command; its stdout. A failure says which command and why."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {(p.stderr or p.stdout).strip()}")
    return p.stdout.strip()


@dataclass
class Host:
    """One host: its namespaces' names, its address and its disk."""

    index: int
    netns: str
    image: str
    rc_file: str
    loop: str = ""  # the loop device this invocation attached for it (set once made)
    proc: subprocess.Popen[str] | None = None
    tail: list[str] = field(default_factory=list)  # its agent's last lines

    @property
    def name(self) -> str:
        return f"host{self.index}"

    @property
    def addr(self) -> str:
        return f"{SUBNET}.{self.index + 1}"


class Hosts:
    """The two hosts of one invocation: made by `up`, removed by `down`, which undoes exactly
    what `up` did, in reverse, and never raises (each step that fails is said, and the others
    still run)."""

    def __init__(self, tag: str, disk_bytes: int, base: str) -> None:
        self.tag = tag
        self.disk_bytes = disk_bytes
        self.workdir = tempfile.mkdtemp(prefix=f"ckptbench-hosts-{tag}-", dir=base)
        self.disk = os.path.join(self.workdir, "disk")  # each host mounts its own disk here
        self.hosts = [
            Host(
                i,
                f"{tag}-h{i}",
                os.path.join(self.workdir, f"host{i}.img"),
                os.path.join(self.workdir, f"host{i}.rc"),
            )
            for i in range(2)
        ]
        self.made_netns: list[str] = []

    def up(self) -> None:
        os.makedirs(self.disk)
        names = ["127.0.0.1 localhost"] + [f"{h.addr} {h.name}" for h in self.hosts]
        with open(os.path.join(self.workdir, "hosts"), "w") as f:
            f.write("\n".join(names) + "\n")
        for h in self.hosts:
            with open(h.image, "wb") as f:
                f.truncate(self.disk_bytes)
            # O_DIRECT on the backing file: the loop device's pages are cached once, in its
            # own file system's page cache, not again in the machine's.
            h.loop = _sh("losetup", "--find", "--show", "--direct-io=on", h.image)
            _sh("mkfs.ext4", "-q", "-F", "-L", f"{self.tag}{h.index}", h.loop)
        for h in self.hosts:
            _sh("ip", "netns", "add", h.netns)
            self.made_netns.append(h.netns)
        a, b = self.hosts
        # both ends made inside the namespaces: the machine's own namespace never sees them
        _sh(
            "ip", "link", "add", "name", IFNAME, "netns", a.netns, "type", "veth",
            "peer", "name", IFNAME, "netns", b.netns,
        )  # fmt: skip
        for h in self.hosts:
            ns = ("ip", "-n", h.netns)
            _sh(*ns, "addr", "add", f"{h.addr}/24", "dev", IFNAME)
            _sh(*ns, "link", "set", IFNAME, "up")
            _sh(*ns, "link", "set", "lo", "up")

    def start(self, h: Host, cmd: list[str], env: dict[str, str]) -> None:
        """Host h's agent, in its namespaces, in a session of its own (Ctrl-C reaches it only
        through `stop`)."""
        enter = [
            "ip", "netns", "exec", h.netns,
            "unshare", "--uts", "--mount", "--propagation", "private", "--",
            "sh", "-c", ENTER, "sh", h.name, h.loop, self.disk,
            os.path.join(self.workdir, "hosts"),
        ]  # fmt: skip
        h.proc = subprocess.Popen(
            enter + cmd,
            cwd=REPO,
            env={**env, RC_FILE_ENV: h.rc_file},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Interrupt every agent still running (its whole session), then kill what is left."""
        live = [h for h in self.hosts if h.proc is not None and h.proc.poll() is None]
        for h in live:
            _signal_group(h, signal.SIGINT)
        end = time.monotonic() + grace_s
        for h in live:
            assert h.proc is not None
            try:
                h.proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for h in self.hosts:
            _signal_group(h, signal.SIGKILL)  # the ranks too, should an agent have left them
            if h.proc is not None:
                h.proc.wait()

    def down(self) -> list[str]:
        """Remove what `up` made: agents, loop devices, namespaces (and their veth), the work
        directory with the disk images. The problems met (empty: all removed)."""
        problems = []
        try:
            self.stop()
        except Exception as e:  # go on removing the rest
            problems.append(f"stopping the agents: {e}")
        for h in self.hosts:
            if not h.loop:
                continue
            # the mount lived in the agent's mount namespace, gone with its last process; a
            # detach of a device still busy for a moment is deferred by the kernel to its close
            try:
                _sh("losetup", "--detach", h.loop)
            except RuntimeError as e:
                problems.append(str(e))
        for ns in reversed(self.made_netns):
            try:
                _sh("ip", "netns", "delete", ns)
            except RuntimeError as e:
                problems.append(str(e))
        for h in self.hosts:
            if h.loop and not _detached(h.loop, h.image):
                problems.append(f"{h.loop} still attached to {h.image}")
        shutil.rmtree(self.workdir, ignore_errors=True)
        return problems


def _signal_group(h: Host, sig: signal.Signals) -> None:
    """Signal host h's agent and its ranks: the session it was started in, by its id."""
    if h.proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(h.proc.pid, sig)


def _detached(loop: str, image: str, wait_s: float = 10.0) -> bool:
    """Whether `loop` no longer holds `image` (waiting up to `wait_s` for a deferred detach)."""
    path = f"/sys/block/{os.path.basename(loop)}/loop/backing_file"
    end = time.monotonic() + wait_s
    while True:
        try:
            with open(path) as f:
                held = f.read().strip()
        except OSError:
            return True
        if not held.startswith(image):
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.1)


def clean(tag: str) -> list[str]:
    """Remove what a killed invocation of `tag` left: its namespaces, its loop devices (those
    whose backing file lies in its work directory), its work directories. What was removed."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", tag):
        raise Refused(f"--clean: {tag!r} is not a tag (letters, digits, _)")
    removed = []
    for line in _sh("ip", "netns", "list").splitlines():
        ns = line.split()[0] if line.split() else ""
        if re.fullmatch(rf"{re.escape(tag)}-h\d+", ns):
            _sh("ip", "netns", "delete", ns)
            removed.append(f"netns {ns}")
    for line in _sh("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and f"/ckptbench-hosts-{tag}-" in parts[1]:
            _sh("losetup", "--detach", parts[0])
            removed.append(f"loop {parts[0]} ({parts[1]})")
    for base in {tempfile.gettempdir()}:
        for d in os.listdir(base):
            if d.startswith(f"ckptbench-hosts-{tag}-"):
                shutil.rmtree(os.path.join(base, d), ignore_errors=True)
                removed.append(f"dir {os.path.join(base, d)}")
    return removed


def agent_command(
    h: Host, nproc: int, tag: str, disk: str, timeout_s: float, bench: list[str], extra: list[str]
) -> list[str]:
    """Host h's torchrun agent: node h.index of 2, the c10d rendezvous on host 0."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--node-rank", str(h.index), "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{SUBNET}.1:{PORT}", "--rdzv-id", tag,
        "--rdzv-conf", f"is_host={int(h.index == 0)},join_timeout={timeout_s:g}",
        "--local-addr", h.addr,
        "-m", "bench", *bench, "--set", f"scratch={disk}", *extra,
    ]  # fmt: skip


# torchrun's lines that say nothing to a user here: a reverse lookup of a peer's address (the
# namespaces have no DNS), and a note on an option the launcher must pass for static rendezvous.
QUIET = ("hostname of the client socket cannot be retrieved", "node_rank is only used for static")
# torchrun's report of a rank that exited non-zero: its reason is already said (the rank's own
# line, and this script's last line), so the report and its traceback are kept back.
REPORT = re.compile(r"torch/distributed/elastic/multiprocessing/api\.py.*failed \(exitcode")


def _relay(h: Host, out: IO[str]) -> None:
    """Host h's agent's output, each line prefixed with its host (torchrun's noise and failure
    report kept back), and its last lines kept."""
    assert h.proc is not None and h.proc.stdout is not None
    report = False
    for line in h.proc.stdout:
        h.tail = (h.tail + [line.rstrip("\n")])[-200:]
        report = report or bool(REPORT.search(line))
        if report or any(q in line for q in QUIET):
            continue
        out.write(f"[{h.name}] {line}")
        out.flush()


def _read_rc(h: Host) -> int | None:
    try:
        with open(h.rc_file) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def outcome(hosts: list[Host], timeout_s: float) -> tuple[int, str]:
    """The invocation's exit code and its last line: what each host's first rank left, or
    what its agent said."""
    for h in hosts:
        if any("RendezvousTimeoutError" in line for line in h.tail):
            others = [o.name for o in hosts if o is not h]
            return 2, (
                f"{h.name}: the rendezvous at {SUBNET}.1:{PORT} did not form within "
                f"{timeout_s:g} s (--rdzv-timeout): {', '.join(others)} never joined"
            )
    codes = [_read_rc(h) for h in hosts]
    agents = [h.proc.returncode if h.proc is not None else None for h in hosts]
    said = ", ".join(
        f"{h.name} {c if c is not None else _agent_end(a)}"
        for h, c, a in zip(hosts, codes, agents, strict=True)
    )
    if all(c == 2 for c in codes):
        why = next(
            (
                line.split("ckptbench: error: ", 1)[1]
                for h in hosts
                for line in h.tail
                if "ckptbench: error: " in line
            ),
            "refused",
        )
        return 2, f"refused on every host (exit 2: {said}): {why}"
    rc = codes[0] if codes[0] is not None else (1 if any(agents) else 0)
    return rc, f"exit {rc} ({said})"


def _agent_end(code: int | None) -> str:
    """How an agent ended whose first rank left no exit code: killed by a signal (its host went
    down), or its own exit code."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"agent killed by {signal.Signals(-code).name}"
    return f"agent {code}"


class _Stop(Exception):
    """SIGTERM: end as Ctrl-C does."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Stop


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    old = signal.signal(signal.SIGTERM, _on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        i = argv.index("--")
        argv, bench = argv[:i], argv[i + 1 :]
    else:
        bench = []
    p = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        usage="hosts.py [options] -- run CONFIG [ckptbench run options]",
    )
    p.add_argument("--nproc-per-host", type=int, default=2, help="ranks on each host (2)")
    p.add_argument("--disk", default="512MiB", help="each host's loop device (512MiB)")
    p.add_argument(
        "--host-set",
        action="append",
        default=[],
        metavar="I:KEY=VALUE",
        help="a --set for host I alone (targets and scratch only may differ)",
    )
    p.add_argument("--rdzv-timeout", type=float, default=60.0, help="seconds (60)")
    p.add_argument("--tag", default="", help="the invocation's names' prefix (default: ckh<pid>)")
    p.add_argument("--base", default=tempfile.gettempdir(), help="where the disk images go")
    p.add_argument(
        "--leave-out",
        type=int,
        action="append",
        default=[],
        metavar="I",
        help="make host I but start no agent there (the rendezvous cannot form; for tests)",
    )
    p.add_argument("--clean", metavar="TAG", help="remove what a killed invocation left")
    a = p.parse_args(argv)
    return a, bench


def main(argv: list[str]) -> int:
    a, bench = parse(argv)
    try:
        why = requirements()
        if why:
            raise Refused(why)
        if a.clean:
            for line in clean(a.clean):
                print(f"removed {line}")
            return 0
        if not bench:
            raise Refused("nothing to run: give the ckptbench command after `--`")
        if a.nproc_per_host < 1:
            raise Refused(f"--nproc-per-host: must be at least 1, got {a.nproc_per_host}")
        tag = a.tag or f"{TAG_PREFIX}{os.getpid()}"
        if not re.fullmatch(r"[A-Za-z0-9_]{1,12}", tag):
            raise Refused(f"--tag: {tag!r} must be 1 to 12 letters, digits or _")
        try:
            disk = sizes.parse_size(a.disk)
        except ValueError as e:
            raise Refused(f"--disk: {e}") from None
        extra: dict[int, list[str]] = {0: [], 1: []}
        for s in a.host_set:
            m = re.fullmatch(r"(\d+):(\S+=.*)", s)
            if not m or int(m.group(1)) not in extra:
                raise Refused(f"--host-set: {s!r} is not I:KEY=VALUE with I 0 or 1")
            extra[int(m.group(1))] += ["--set", m.group(2)]
        for i in a.leave_out:
            if i not in extra:
                raise Refused(f"--leave-out: no host {i} (0 or 1)")
    except Refused as e:
        print(f"hosts: error: {e}", file=sys.stderr)
        return 2
    return run(a, tag, disk, bench, extra)


def run(
    a: argparse.Namespace, tag: str, disk: int, bench: list[str], extra: dict[int, list[str]]
) -> int:
    hosts = Hosts(tag, disk, a.base)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": IFNAME, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    code, last = 1, ""
    relays = []
    with _signals():
        try:
            hosts.up()
            for h in hosts.hosts:
                if h.index in a.leave_out:
                    continue
                cmd = agent_command(
                    h, a.nproc_per_host, tag, hosts.disk, a.rdzv_timeout, bench, extra[h.index]
                )
                hosts.start(h, cmd, env)
                t = threading.Thread(target=_relay, args=(h, sys.stderr), daemon=True)
                t.start()
                relays.append(t)
            for h in hosts.hosts:
                if h.proc is not None:
                    h.proc.wait()
            for t in relays:
                t.join(timeout=5)
            code, last = outcome(hosts.hosts, a.rdzv_timeout)
        except (KeyboardInterrupt, _Stop):
            code, last = 130, "interrupted: the agents were stopped"
        except RuntimeError as e:  # a setup command failed
            code, last = 2, f"setup: {e}"
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop teardown
            problems = hosts.down()
            signal.signal(signal.SIGINT, signal.default_int_handler)
    for p in problems:
        print(f"hosts: teardown: {p}", file=sys.stderr)
    print(f"hosts: {last}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
