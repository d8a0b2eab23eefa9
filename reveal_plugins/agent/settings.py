"""``[agent]``: the node agent's settings in the site configuration
(:mod:`reveal_plugins.site_config`).  A command-line option wins, then the environment
(``$REVEAL_SPOOL``, ``$REVEAL_LIVE``, ``$REVEAL_CPUS``, ``$REVEAL_HOST_PROC``: set per process,
e.g. by ``reveal record`` for its private agent), then this table, then the default."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AgentConfig(BaseModel):
    """Keys of ``[agent]``; each is also a ``reveal agent`` option (``--interval`` ...)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    spool: str = Field("", description="spool directory (default $REVEAL_SPOOL or "
                       "/var/spool/reveal)")
    interval_s: float = Field(0.1, ge=0.001, le=60.0, description="sampling interval, seconds")
    segment_s: float = Field(10.0, ge=1.0, le=10.0, description="segment file length, seconds")
    retention_days: float = Field(30.0, ge=0.0, lt=1e5, description="remove "
                                  "<spool>/jobs/<job> this long after its runs ended (0: "
                                  "never)")
    live: bool = Field(False, description="run live detection for every run")
    features: bool = Field(True, description="featurize each run's segments while it goes on "
                           "(long runs are then analysed from features at job end)")
    socket_group: str = Field("", description="root agent: only this group (and root) may "
                              "connect (socket 0660)")
    cpus: str = Field("", description="the node's CPU set, e.g. 0-3,8 (default: all online "
                      "cores)")
    host_proc: str = Field("", description="the machine's /proc mounted here, when the agent "
                           "runs in a PID namespace of the node's")

    @field_validator("spool", "host_proc")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if v and not v.startswith("/"):
            raise ValueError("must be an absolute path")
        return v


#: ``[agent]`` key -> the ``reveal agent`` option's argparse destination.
OPTION_OF = {"spool": "spool", "interval_s": "interval", "segment_s": "segment",
             "retention_days": "retention_days", "live": "live", "socket_group": "socket_group",
             "cpus": "cpus", "host_proc": "host_proc"}

#: ``[agent]`` key -> the environment variable that wins over it.
ENV_OF = {"spool": "REVEAL_SPOOL", "live": "REVEAL_LIVE", "cpus": "REVEAL_CPUS",
          "host_proc": "REVEAL_HOST_PROC"}
