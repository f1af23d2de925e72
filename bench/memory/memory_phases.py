"""Where a stage's memory goes: the resident set sampled every 10 ms while `rlhf ARGS` runs in this
process, with the peak reached inside each named phase of the run.

    .venv/bin/python bench/memory/memory_phases.py sft --model DIR --data FILE --train.max_steps 2 ...
    .venv/bin/python bench/memory/memory_phases.py train --policy DIR --reward-model DIR ...

    .venv/bin/python bench/memory/memory_phases.py --saved-tensors train ...   # + autograd's saved bytes

Prints one line per phase (`phase  calls  rss at entry  peak inside`, MiB) after the run, and what
glibc malloc says at that peak (`mallinfo2`, every arena): heap bytes in live allocations, heap
bytes free but kept by malloc (the freed memory it holds for reuse: resident once touched), and
bytes in separately mmapped blocks (allocations over the mmap threshold, unmapped when freed).
A phase is the outermost wrapped call running on the main thread; work it hands to helper threads
(the critic's overlapped steps, split forwards) counts in it.

`--saved-tensors`: the bytes autograd keeps for the backward of each update micro-batch (the
policy's loss, the critic's value loss): distinct storages packed by
`torch.autograd.graph.saved_tensors_hooks`, parameters excluded, the largest shapes listed. The
hooks return each tensor as it is; nothing here changes what runs.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (module, attribute, phase name): functions looked up by these names when the stage runs
PHASES = [
    ("rlhf.models.loading", "load_causal_lm", "load model"),
    ("rlhf.stages.sft", "sft_step", "forward+backward"),
    ("rlhf.stages.sft", "evaluate_nll", "evaluate"),
    ("rlhf.train.optimizer", "clip_and_step", "optimizer step"),
    ("rlhf.train.supervised", "export_causal_lm", "export"),
    ("rlhf.stages.dpo.DPOStage", "build_model", "build model (+ reference copy)"),
    ("rlhf.stages.dpo.DPOStage", "cache_reference", "reference log-probs"),
    ("rlhf.stages.dpo", "pair_logprobs", "forward+backward"),
    ("rlhf.stages.rm", "pair_forward", "forward+backward"),
    ("rlhf.stages.rm", "ranking_loss", "forward+backward"),
    ("rlhf.stages.rm", "evaluate_pairs", "evaluate"),
    ("rlhf.stages.rm", "save_reward_model", "export"),
    ("rlhf.rl.roles.assemble", "assemble_roles", "build roles"),
    ("rlhf.rl.roles.policy.Policy", "generate", "rollout"),
    ("rlhf.rl.scorer.Scorer", "score", "score"),
    ("rlhf.rl.roles.policy.Policy", "logprobs", "old log-probs"),
    ("rlhf.models.reference.ReferenceModel", "session", None),  # a context manager: see below
    ("rlhf.rl.roles.critic.Critic", "values", "values"),
    ("rlhf.rl.trainer.RLTrainer", "update", "update"),
    ("rlhf.rl.trainer.RLTrainer", "save_checkpoint", "checkpoint"),
    ("rlhf.rl.roles.assemble.Roles", "export", "export"),
]


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


def _mallinfo2():
    try:
        function = ctypes.CDLL(None).mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    function.restype = _Mallinfo2
    return function


MALLINFO2 = _mallinfo2()


def malloc_mib() -> dict[str, float]:
    """glibc malloc over every arena, MiB: `used` heap bytes in live allocations, `free` heap bytes
    freed and kept for reuse, `mmapped` bytes of live mmapped blocks; {} off glibc."""
    if MALLINFO2 is None:
        return {}
    m = MALLINFO2()
    return {"used": m.uordblks / MIB, "free": m.fordblks / MIB, "mmapped": m.hblkhd / MIB}


MIB = float(1 << 20)


def arenas_mib() -> list[tuple[float, float]]:
    """(bytes obtained from the OS, bytes free) of each glibc malloc arena, MiB (malloc_info's
    report: arena 0 is the main thread's, the others were made for other threads); [] off glibc."""
    import os
    import re
    import tempfile

    try:
        libc = ctypes.CDLL(None)
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    except (OSError, AttributeError):
        return []
    handle, path = tempfile.mkstemp()
    os.close(handle)
    stream = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    text = Path(path).read_text()
    os.unlink(path)
    out = []
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', text, re.S):
        free = sum(
            int(n) for n in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', heap)
        )
        system = int(re.search(r'<system type="current" size="(\d+)"/>', heap).group(1))
        out.append((system / MIB, free / MIB))
    return out


class PhaseRecorder:
    """RSS sampled every 10 ms, attributed to the phase running on the main thread: per call of a
    phase (`update #2`), the RSS at entry, the peak inside with malloc's figures at that peak, and
    the RSS and malloc's figures at exit (what the phase leaves behind)."""

    def __init__(self) -> None:
        self.phase = "other"
        self.calls: dict[str, int] = {}
        self.stats: dict[str, dict] = {}  # "name #k" -> entry, peak, malloc, exit, exit_malloc
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def sample(self) -> None:
        while not self.stop.wait(0.01):
            value = rss_mib()
            with self.lock:
                s = self.stats.setdefault(self.phase, {"entry": value, "peak": 0.0})
                if value > s["peak"]:
                    s["peak"] = value
                    s["malloc"] = malloc_mib()  # read at each new peak only: it walks every arena

    def enter(self, name: str):
        previous = self.phase
        if previous != "other":
            return None  # nested: the outer phase keeps the samples
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            self.phase = f"{name} #{self.calls[name]}"
            value = rss_mib()
            self.stats[self.phase] = {"entry": value, "peak": value, "malloc": malloc_mib()}
        return previous

    def leave(self, previous) -> None:
        if previous is not None:
            with self.lock:
                s = self.stats[self.phase]
                s["exit"], s["exit_malloc"], s["arenas"] = rss_mib(), malloc_mib(), arenas_mib()
                s["peak"] = max(s["peak"], s["exit"])
                self.phase = previous

    def wrap(self, function, name: str):
        recorder = self

        def wrapped(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                return function(*args, **kwargs)
            token = recorder.enter(name)
            try:
                return function(*args, **kwargs)
            finally:
                recorder.leave(token)

        return wrapped

    def wrap_context(self, function, name: str):
        import contextlib

        recorder = self

        @contextlib.contextmanager
        def wrapped(*args, **kwargs):
            token = recorder.enter(name)
            try:
                with function(*args, **kwargs) as value:
                    yield value
            finally:
                recorder.leave(token)

        return wrapped


def phase_target(path: str):
    """The module or class named by a PHASES path ("rlhf.stages.dpo", "rlhf.stages.dpo.DPOStage")."""
    module_path, _, owner = path.rpartition(".")
    try:
        return importlib.import_module(path)
    except ImportError:
        return getattr(importlib.import_module(module_path), owner)


def install(recorder: PhaseRecorder) -> None:
    for path, attr, name in PHASES:
        target = phase_target(path)
        function = getattr(target, attr)
        if name is None:
            setattr(target, attr, recorder.wrap_context(function, "reference log-probs"))
        else:
            setattr(target, attr, recorder.wrap(function, name))


class SavedTensors:
    """Bytes autograd keeps for the backward of each update micro-batch, per role: the distinct
    storages the saved-tensor hooks see while the micro-batch's loss is built, parameters excluded
    (they are the weights, counted apart)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.per_role: dict[str, list[int]] = {}  # role -> saved bytes of each micro-batch
        self.shapes: dict[str, dict[tuple, list[int]]] = {}  # role -> (shape, dtype) -> [count, bytes]

    def count(self, role: str, model, function):
        import torch

        recorder = self

        def wrapped(*args, **kwargs):
            params = {q.untyped_storage().data_ptr() for q in model(args).parameters()}
            storages: dict[int, tuple[int, tuple]] = {}

            def pack(tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in params and storage.nbytes():
                    storages[storage.data_ptr()] = (
                        storage.nbytes(),
                        (tuple(tensor.shape), str(tensor.dtype)),
                    )
                return tensor

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                out = function(*args, **kwargs)
            with recorder.lock:
                recorder.per_role.setdefault(role, []).append(sum(n for n, _ in storages.values()))
                shapes = recorder.shapes.setdefault(role, {})
                for n, key in storages.values():
                    entry = shapes.setdefault(key, [0, 0])
                    entry[0] += 1
                    entry[1] += n
            return out

        return wrapped

    def install(self) -> None:
        from rlhf.rl.roles import critic, policy

        self_policy = policy.Policy.policy_terms
        policy.Policy.policy_terms = self.count("policy", lambda args: args[0].model, self_policy)
        critic.value_micro_loss = self.count("critic", lambda args: args[0].model, critic.value_micro_loss)

    def report(self) -> None:
        for role, sizes in self.per_role.items():
            calls = len(sizes)
            print(
                f"\nsaved for backward, {role}: {calls} micro-batches, max {max(sizes) / MIB:.0f} MiB, "
                f"mean {sum(sizes) / calls / MIB:.0f} MiB; largest shapes (bytes per micro-batch):"
            )
            top = sorted(self.shapes[role].items(), key=lambda kv: -kv[1][1])[:12]
            for (shape, dtype), (count, nbytes) in top:
                print(
                    f"  {count / calls:6.1f} x {str(list(shape)):24} {dtype:14} {nbytes / calls / MIB:8.1f} MiB"
                )


def main() -> int:
    import torch

    from bench.common import set_threads

    set_threads(torch.get_num_threads())
    args = sys.argv[1:]
    saved = SavedTensors() if args[:1] == ["--saved-tensors"] else None
    if saved is not None:
        args = args[1:]
        saved.install()
    recorder = PhaseRecorder()
    install(recorder)
    sampler = threading.Thread(target=recorder.sample, daemon=True)
    sampler.start()
    from rlhf.cli import main as rlhf

    started = time.perf_counter()
    code = rlhf(args)
    recorder.stop.set()
    sampler.join()
    print(f"\nRSS and glibc malloc (used / free / mmapped), MiB   ({time.perf_counter() - started:.0f} s)")
    print(
        f"{'phase':24} {'entry':>6} {'peak':>6} {'used':>6} {'free':>6} {'mmap':>6}   {'exit':>6} {'used':>6} {'free':>6}"
    )
    for name, s in recorder.stats.items():  # in the order the phases ran
        m, e = s.get("malloc") or {}, s.get("exit_malloc") or {}
        at_peak = f"{m['used']:6.0f} {m['free']:6.0f} {m['mmapped']:6.0f}" if m else " " * 20
        at_exit = f"{s['exit']:6.0f} {e['used']:6.0f} {e['free']:6.0f}" if e else ""
        print(f"{name:24} {s['entry']:6.0f} {s['peak']:6.0f} {at_peak}   {at_exit}")
    print("\nglibc arenas at each phase's exit (MiB obtained from the OS / free in it), arena 0 first:")
    for name, s in recorder.stats.items():
        if s.get("arenas"):
            print(
                f"{name:24} "
                + "  ".join(f"{system:.0f}/{free:.0f}" for system, free in s["arenas"] if system >= 1)
            )
    if saved is not None:
        saved.report()
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
