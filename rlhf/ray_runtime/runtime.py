"""The driver's side of `dist.runtime ray`: the loop's calls by name, each sent to the actor group
serving the role (rlhf/ray_runtime/worker.py), with the same results as the local runtime.

A group's actors all run each call (with several, each on its share of the rows, joined inside
the group); the driver takes its first actor's answer (under `dist.strategy fsdp2` a call that
needs a whole model gathers it on every actor, rank 0 answering: rlhf/ray_runtime/worker.py). The
policy's and a separate critic's optimizer steps run at once, on their own actors. Checkpoints and
exports keep the local layout: each learner group writes its files (a sharded group: its DCP
shards) into the directory the driver commits (the run directory is on a file system every node
sees)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlhf.config import ConfigError, RLConfig
from rlhf.data.collate import PtxBatches
from rlhf.models.loading import load_tokenizer, prepare_tokenizer
from rlhf.models.sampling import Rollout, SamplingConfig
from rlhf.models.sequences import Sequences
from rlhf.parallel.process_group import LostWorker
from rlhf.ray_runtime.hosts import ROLLOUT, group_of, role_hosts
from rlhf.ray_runtime.placement import place
from rlhf.ray_runtime.worker import RoleWorker
from rlhf.rundir import checkpoint as ckpt
from rlhf.runtime.protocol import Minibatch

if TYPE_CHECKING:  # Ray is imported when a run asks for it
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

LEARNERS = ("policy", "critic")


class ActorFailed(LostWorker):
    """A role's actor died: the message names the role, the actor and its node."""


def start_ray(config: RLConfig) -> bool:
    """Join the cluster at `ray.address`, or start Ray on this machine; True when started here."""
    import ray

    if ray.is_initialized():
        return False
    quiet = not config.ray.show_logs
    try:
        ray.init(
            address=config.ray.address,
            include_dashboard=False,
            log_to_driver=not quiet,
            logging_level=logging.WARNING if quiet else logging.INFO,
            configure_logging=True,
        )
    except ConnectionError as err:  # an address that answers but is no Ray cluster (rlhf/preflight.py)
        raise ConfigError(
            f"ray.address {config.ray.address!r}: {str(err).splitlines()[0]}. Fix: the address `ray start --head` "
            "printed (HOST:6379), or leave --ray.address out to start Ray on this machine.",
            "ray.address",
        ) from None
    return config.ray.address is None


class PendingCall:
    """A call running on a group's actors; `result()` is its first actor's answer (and checks the
    weight loads submitted before it: `loads`)."""

    def __init__(self, runtime: RayRuntime, group: str, refs: list[Any], loads: list[Any]) -> None:
        self.runtime, self.group, self.refs, self.loads = runtime, group, refs, loads

    def result(self) -> Rollout:
        rollout: Rollout = self.runtime._get(self.group, self.refs, self.loads)[0]
        return rollout


class RayRuntime:
    """The runtime of `rlhf train --dist.runtime ray` (rlhf/runtime/__init__.py names its calls)."""

    writer = True  # the driver writes the run directory; the learner groups add their weights

    def __init__(self, config: RLConfig) -> None:
        import ray

        self.config = config
        self.hosts = role_hosts(config)
        self.started_ray = start_ray(config)
        self.placements: list[PlacementGroup] = []
        self.actors: dict[str, list[Any]] = {}  # Ray actor handles of RoleWorker, by group
        self.nodes: dict[str, list[str]] = {}
        self.loading: list[Any] = []  # the rollout actors' weight loads not yet checked (`sync_rollout`)
        try:
            self.placements, strategies = place(config.ray, list(self.hosts))
            self._launch(config, strategies, ray.remote(RoleWorker))
        except BaseException:
            self.close()
            raise
        self._tokenizer = prepare_tokenizer(
            load_tokenizer(config.model.policy, gguf_file=config.model.gguf_file)
        )
        self.facts = self._first("policy", "facts")
        self.policy_version = 0  # the policy's updates the rollout group's copy has received

    def _launch(
        self,
        config: RLConfig,
        strategies: dict[str, list[PlacementGroupSchedulingStrategy]],
        remote_worker: Any,
    ) -> None:
        """Start every group's actors (each group's members meet at its first actor's address). Every
        actor's process starts at once: each imports torch and transformers, seconds apiece."""
        for group in self.hosts:
            spec = getattr(config.ray, group)
            self.actors[group] = [
                remote_worker.options(
                    num_cpus=spec.num_cpus, num_gpus=spec.num_gpus, scheduling_strategy=strategy,
                    name=None, max_restarts=0,
                ).remote()
                for strategy in strategies[group]
            ]  # fmt: skip
        meets = {group: actors[0].address.remote() for group, actors in self.actors.items()}
        pending = []
        for group, roles in self.hosts.items():
            actors, meet = self.actors[group], self._get(group, [meets[group]])[0]
            threads = max(1, int(getattr(config.ray, group).num_cpus))
            setups = [
                a.setup.remote(config, group, roles, i, len(actors), meet, threads)
                for i, a in enumerate(actors)
            ]
            pending.append((group, setups))
        for group, refs in pending:
            self.nodes[group] = self._get(group, refs)

    # -- calls ---------------------------------------------------------------------------------
    def _get(self, group: str, refs: list[Any], loads: list[Any] | None = None) -> list[Any]:
        """The answers of `group`'s actors; a user's mistake raised in an actor is raised here as it
        is, a dead actor as ActorFailed naming it. On the rollout group the weight loads submitted
        before `refs` are checked first (`loads`; None: every unchecked one)."""
        import ray

        loads = self.loading if loads is None else loads
        if group == ROLLOUT and loads:  # a load that failed fails the next rollout call after it
            self.loading = [r for r in self.loading if r not in loads]
            return self._get(group, [*loads, *refs], [])[len(loads) :]
        try:
            return ray.get(refs, timeout=None)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else None
            if cause is not None:
                raise cause from None
            raise
        except ray.exceptions.RayActorError as e:
            nodes = self.nodes.get(group) or ["?"]
            raise ActorFailed(
                f"an actor of the Ray role group {group!r} (roles {', '.join(self.hosts[group])}; node "
                f"{nodes[0]}) died: {str(e).splitlines()[0]}. The run stops. Fix: find why in the actor's log "
                f"(--ray.show_logs true shows them), then continue from the last checkpoint with "
                f"`rlhf train --resume {self.config.out}` (no checkpoint yet: start again)."
            ) from None

    def _call(self, group: str, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every actor of `group`; their answers."""
        return self._get(group, [getattr(a, method).remote(*args) for a in self.actors[group]])

    def _first(self, group: str, method: str, *args: Any) -> Any:
        """`method(*args)` on every actor of `group`; the first actor's answer."""
        return self._call(group, method, *args)[0]

    def _learner_groups(self) -> list[str]:
        return [g for g in self.hosts if g != ROLLOUT and any(r in LEARNERS for r in self.hosts[g])]

    def generate(self, prompts: list[list[int]], return_logprobs: bool) -> Rollout:
        """The rollout: sampled by the rollout group when there is one, else by the policy's."""
        group = ROLLOUT if ROLLOUT in self.actors else "policy"
        rollout: Rollout = self._first(group, "generate", prompts, return_logprobs)
        return rollout

    def submit_generate(self, prompts: list[list[int]], return_logprobs: bool) -> PendingCall:
        """The rollout group's sampling of `prompts`, started now; `.result()` waits for it (the
        driver goes on meanwhile: asynchronous rollouts, rollout.max_staleness)."""
        refs = [a.generate.remote(prompts, return_logprobs) for a in self.actors[ROLLOUT]]
        return PendingCall(self, ROLLOUT, refs, list(self.loading))

    def sync_rollout(self) -> None:
        """The policy group's trained parameters copied into every rollout actor's policy (through
        Ray's object store: sent once, read by each), after each update of the policy. Not waited
        for: a rollout actor runs its calls in order, so every rollout submitted later samples with
        these weights, and one submitted earlier (rollout.max_staleness) with the weights before;
        the loads' answers are checked with the next call on the rollout group (`_get`)."""
        if ROLLOUT not in self.actors:
            return
        # a reference: the weights pass from the policy's actor to the rollout's, never to the driver;
        # every policy actor is called (fsdp2: each gathers the whole policy), rank 0's answer sent
        weights, *gathered = [a.policy_weights.remote() for a in self.actors["policy"]]
        self.loading += [*gathered, *(a.load_policy_weights.remote(weights) for a in self.actors[ROLLOUT])]
        self.policy_version += 1

    def forward(self, role: str, sequences: Sequences, temperature: float | None = None) -> torch.Tensor:
        result: torch.Tensor = self._first(
            group_of(self.hosts, role), "forward", role, sequences, temperature
        )
        return result

    def sample(self, prompts: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        """An evaluator's sampling by the policy's group (the trained weights, never a stale copy)."""
        rollout: Rollout = self._first("policy", "sample", prompts, sampling, seed)
        return rollout

    def train(self, roles: Sequence[str], minibatches: Sequence[Minibatch]) -> list[dict[str, float]]:
        """Each named learner's steps, the groups' at once (the minibatches sent once, shared)."""
        import ray

        shared = ray.put(list(minibatches))
        calls = []
        for role in roles:
            group = group_of(self.hosts, role)
            calls.append((group, [a.train.remote([role], shared) for a in self.actors[group]]))
        results: list[dict[str, float]] = []
        for group, refs in calls:
            results += self._get(group, refs)[0]
        if "policy" in roles:
            self.sync_rollout()
        return results

    # -- facts, state, weights, export -----------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The policy's tokenizer, read by the driver itself (prompts, texts for reward functions)."""
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")  # the loop's tensors stay on the driver's CPU

    def has_role(self, name: str) -> bool:
        return any(name in roles for roles in self.hosts.values())

    def learner_names(self, train_policy: bool = True) -> list[str]:
        return list(self.facts["learner_names"][train_policy])

    @property
    def policy_context(self) -> int | None:
        """The policy's positions (for the prompts' length check)."""
        context: int | None = self.facts["context"]
        return context

    def learning_rates(self) -> dict[str, float]:
        rates: dict[str, float] = {}
        for group in self._learner_groups():
            rates.update(self._first(group, "learning_rates"))
        return rates

    def use_ptx(self, batches: PtxBatches, coef: float, seed: int) -> None:
        self._call("policy", "use_ptx", batches, coef, seed)

    def role_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for group in self._learner_groups():
            state.update(self._first(group, "role_state"))
        if ROLLOUT in self.actors:  # the generator that drew the rollouts is the rollout group's
            state["policy"]["sample_generator"] = self._first(ROLLOUT, "sampler_state")
        # every actor's global generators, by group and rank (a resumed run draws what this one would)
        state["actor_rng"] = {group: self._call(group, "rng_state") for group in self.actors}
        return state

    def load_role_state(self, state: dict[str, Any]) -> None:
        for group in self._learner_groups():
            self._call(group, "load_role_state", state)
        if ROLLOUT in self.actors and "sample_generator" in state["policy"]:
            self._call(ROLLOUT, "load_sampler_state", state["policy"]["sample_generator"])
        for group, states in state.get("actor_rng", {}).items():  # none: a local run's checkpoint
            if group in self.actors:
                self._call(group, "load_rng_state", states)

    def save_checkpoint(self, directory: Path, state: dict[str, Any], steps_done: int) -> None:
        """The driver's checkpoint: each learner group writes its weights into the directory the
        driver commits (a sharded group: its DCP shards), the driver the roles' state, `state`, DONE."""
        with ckpt.atomic_directory(directory) as tmp:
            self.save_weights(tmp)
            ckpt.save_state({**state, "roles": self.role_state()}, tmp, "trainer")
            ckpt.write_done(tmp, steps_done)  # sizes and checksums: verified on resume

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        self.load_weights(directory)
        state: dict[str, Any] = ckpt.load_state(directory, "trainer")
        self.load_role_state(state["roles"])
        return state

    def save_weights(self, directory: Path) -> None:
        for group in self._learner_groups():
            self._call(group, "save_weights", str(directory))

    def load_weights(self, directory: Path) -> None:
        for group in self._learner_groups():
            self._call(group, "load_weights", str(directory))
        self.sync_rollout()

    def export(self, directory: Path) -> None:
        """The trained models and the tokenizer, committed at once (rlhf/rundir/export.py's layout)."""
        with ckpt.atomic_export(directory) as tmp:
            for group in self._learner_groups():
                self._call(group, "export_into", str(tmp))
            self._tokenizer.save_pretrained(tmp)

    def close(self) -> None:
        """End the actors and free their placement groups (and Ray, when started here)."""
        import ray

        for actors in self.actors.values():
            for actor in actors:
                ray.kill(actor)
        self.actors = {}
        for placement in self.placements:
            ray.util.remove_placement_group(placement)
        self.placements = []
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False
