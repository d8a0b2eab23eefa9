"""``[fleet]``: TLS of the fleet pass's Dask cluster in the site configuration
(:mod:`reveal_plugins.site_config`).  The ``reveal fleet`` options ``--tls-ca-file``,
``--tls-cert`` and ``--tls-key`` win over it (all three together, or this table)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FleetConfig(BaseModel):
    """Keys of ``[fleet]``: the PEM files a ``--scheduler`` / ``--slurm-workers`` cluster uses
    for mutual TLS (without them those modes are refused unless ``--insecure``)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tls_ca_file: str | None = Field(None, description="CA bundle (PEM) the scheduler and "
                                    "workers trust")
    tls_cert: str | None = Field(None, description="this pass's certificate (PEM)")
    tls_key: str | None = Field(None, description="its private key (if not in tls_cert)")


#: The TLS keys, in the order ``cluster_security`` takes them.
TLS_KEYS = tuple(FleetConfig.model_fields)
