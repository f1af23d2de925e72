"""Threads on a shared machine (rlhf/parallel/threads.py): OMP_NUM_THREADS, the affinity mask and
the cgroup CPU quota decide how many threads a run uses, and how many the side-by-side work gets."""

from __future__ import annotations

import pytest
import torch

from rlhf.parallel import threads
from rlhf.parallel.threads import (
    available_cores,
    cgroup_cpus,
    limit_threads,
    omp_num_threads,
    side_by_side_threads,
    thread_budget,
)


@pytest.fixture()
def machine(monkeypatch, tmp_path):
    """`machine(cores, quota=None, omp=None)`: a process pinned to `cores` CPUs, under a cgroup
    quota of `quota` CPUs (None: "max"), with OMP_NUM_THREADS `omp` (None: unset)."""
    cpu_max = tmp_path / "cpu.max"

    def setup(cores: int, quota: float | None = None, omp: str | None = None) -> None:
        monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        cpu_max.write_text("max 100000\n" if quota is None else f"{int(quota * 100000)} 100000\n")
        monkeypatch.setattr(threads, "CGROUP_CPU_MAX", cpu_max)
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)

    previous = torch.get_num_threads()
    yield setup
    torch.set_num_threads(previous)


def test_cores_are_the_affinity_mask_within_the_cgroup_quota(machine, tmp_path):
    machine(cores=16)
    assert available_cores() == 16
    machine(cores=16, quota=2)  # docker --cpus 2 on a 16-core host
    assert available_cores() == 2
    machine(cores=16, quota=2.5)  # a fraction of a CPU still gets a thread
    assert available_cores() == 3
    machine(cores=4, quota=8)  # taskset -c 0-3 inside a larger quota
    assert available_cores() == 4
    for text in ["", "garbage", "100000 0", "max"]:
        (tmp_path / "odd").write_text(text)
        assert cgroup_cpus(tmp_path / "odd") is None
    assert cgroup_cpus(tmp_path / "missing") is None  # cgroup v1, macOS


def test_omp_num_threads_is_the_budget_when_set(machine):
    machine(cores=16, quota=8, omp="3")
    assert omp_num_threads() == 3 and thread_budget() == 3
    for unusable in ["", "0", "-2", "four"]:
        machine(cores=16, quota=8, omp=unusable)
        assert omp_num_threads() is None and thread_budget() == 8
    machine(cores=16, omp="4,2")  # nested OpenMP levels: the first is ours
    assert thread_budget() == 4


def test_torch_threads_are_lowered_to_the_budget_never_raised(machine):
    machine(cores=16, quota=2)
    torch.set_num_threads(8)
    assert limit_threads() == 2 == torch.get_num_threads()
    torch.set_num_threads(1)
    assert limit_threads() == 1  # fewer than allowed (a test, `rlhf demo`): left as they are
    machine(cores=16, omp="3")
    torch.set_num_threads(6)
    assert limit_threads() == 3


def test_side_by_side_work_stays_within_the_budget(machine):
    torch.set_num_threads(1)
    machine(cores=2)
    assert side_by_side_threads() == 1  # two cores: one thread per side
    machine(cores=2, omp="1")
    assert side_by_side_threads() is None  # OMP_NUM_THREADS=1: no second thread
    machine(cores=16, quota=1)
    assert side_by_side_threads() is None  # a quota of one CPU: the two sides would take turns
    torch.set_num_threads(8)
    machine(cores=16, omp="4")
    assert side_by_side_threads() == 2  # 4 threads in all, not 8
    machine(cores=16, quota=6)
    assert side_by_side_threads() == 3


@pytest.fixture()
def torchrun_rank(machine, monkeypatch, tmp_path):
    """`torchrun_rank(cores, ranks, omp, parent_had_omp)`: a rank of a torchrun launch with `ranks`
    processes on this node; torchrun's process (the parent) started with OMP_NUM_THREADS in its
    environment or without it (a fake /proc/PPID/environ)."""

    def setup(cores: int, ranks: int, omp: str | None, parent_had_omp: bool) -> None:
        machine(cores=cores, omp=omp)
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
        parent = tmp_path / "proc" / "4242"
        parent.mkdir(parents=True, exist_ok=True)
        start = (
            [b"PATH=/usr/bin", b"OMP_NUM_THREADS=" + omp.encode()] if parent_had_omp else [b"PATH=/usr/bin"]
        )
        (parent / "environ").write_bytes(b"\0".join(start) + b"\0")
        monkeypatch.setattr(threads, "PROC", tmp_path / "proc")
        monkeypatch.setattr(threads.os, "getppid", lambda: 4242)

    return setup


def test_torchrun_ranks_share_the_cores_and_ignore_torchruns_own_omp_default(torchrun_rank):
    torchrun_rank(cores=8, ranks=2, omp=None, parent_had_omp=False)
    assert thread_budget() == 4  # 8 cores, 2 ranks on the node
    torchrun_rank(cores=8, ranks=2, omp="1", parent_had_omp=False)  # torchrun set the 1 itself
    assert threads.launcher_default_omp() and thread_budget() == 4
    assert threads.oversubscription_note() is None
    torchrun_rank(cores=8, ranks=2, omp="1", parent_had_omp=True)  # OMP_NUM_THREADS=1 torchrun ...
    assert not threads.launcher_default_omp() and thread_budget() == 1
    torchrun_rank(cores=8, ranks=2, omp="3", parent_had_omp=True)
    assert thread_budget() == 3 and threads.oversubscription_note() is None
    torchrun_rank(cores=8, ranks=4, omp="6", parent_had_omp=True)  # 4 x 6 threads on 8 cores: no
    assert thread_budget() == 2
    note = threads.oversubscription_note()
    assert "OMP_NUM_THREADS=6" in note and "4 ranks on this node" in note and "2 thread(s)" in note
    torchrun_rank(cores=2, ranks=4, omp=None, parent_had_omp=False)
    assert thread_budget() == 1  # more ranks than cores: one thread each, never zero


def test_without_proc_an_omp_num_threads_of_1_is_the_users(torchrun_rank, monkeypatch, tmp_path):
    torchrun_rank(cores=8, ranks=2, omp="1", parent_had_omp=False)
    monkeypatch.setattr(threads, "PROC", tmp_path / "no-proc")  # macOS: the parent's start unknown
    assert not threads.launcher_default_omp() and thread_budget() == 1
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # not under torchrun: a 1 is always the user's
    monkeypatch.setattr(threads, "PROC", tmp_path / "proc")
    assert not threads.launcher_default_omp()


def test_an_explicit_omp_num_threads_above_the_cores_is_lowered(machine):
    machine(cores=2, omp="8")
    assert thread_budget() == 2 and "OMP_NUM_THREADS=8" in threads.oversubscription_note()
