"""The few plain types that cross rooms: channel metadata, run identity, a frame of samples."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUBSYSTEMS = ("cpu", "gpu", "memory", "network", "storage", "system")
KINDS = ("counter", "gauge")


@dataclass(frozen=True)
class ChannelMeta:
    """One telemetry channel.  ``name`` starts with its subsystem (``cpu.``, ``gpu.`` ...).

    ``kind`` is ``counter`` (monotonic cumulative value; analysis turns it into a rate per
    second) or ``gauge`` (an instantaneous value).
    """

    name: str
    unit: str
    kind: str
    probe: str
    description: str = ""
    #: Set when the probe is read less often than the agent ticks (slow-moving sources): the
    #: stored series has NaN between reads, which readers interpolate (see store.load_run).
    sample_every_s: float | None = None

    def __post_init__(self) -> None:
        if self.subsystem not in SUBSYSTEMS:
            raise ValueError(f"channel {self.name!r}: name must start with one of {SUBSYSTEMS}")
        if self.kind not in KINDS:
            raise ValueError(f"channel {self.name!r}: kind {self.kind!r} not in {KINDS}")

    @property
    def subsystem(self) -> str:
        return self.name.split(".", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["sample_every_s"] is None:
            del d["sample_every_s"]
        d["subsystem"] = self.subsystem
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ChannelMeta":
        return cls(name=d["name"], unit=d.get("unit", ""), kind=d.get("kind", "gauge"),
                   probe=d.get("probe", ""), description=d.get("description", ""),
                   sample_every_s=d.get("sample_every_s"))


@dataclass
class RunInfo:
    """Identity of a run (a Slurm job, a torchrun launch, a ``reveal record``) on one node.

    ``pids`` / ``cgroup`` scope the run-level probes; ``gpus`` are host GPU indices the run owns
    (None = all GPUs on the node).
    """

    run_id: str
    run_dir: str
    source: str = "local"          # local | slurm | torchrun
    host: str = ""
    job_id: str | None = None
    step_id: str | None = None
    user: str | None = None
    uid: int | None = None
    gid: int | None = None
    command: list[str] | str | None = None
    pids: list[int] = field(default_factory=list)
    cgroup: str | None = None
    gpus: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunInfo":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown run field(s): {sorted(unknown)}")
        return cls(**d)


@dataclass
class Frame:
    """Samples of one run: ``t`` (n,) unix seconds, ``values`` (n, c) float64, one column per channel."""

    t: np.ndarray
    values: np.ndarray
    channels: list[ChannelMeta]

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape != (len(self.t), len(self.channels)):
            raise ValueError(f"frame shape {self.values.shape} does not match "
                             f"{len(self.t)} samples x {len(self.channels)} channels")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.channels]

    def column(self, name: str) -> np.ndarray:
        return self.values[:, self.names.index(name)]
