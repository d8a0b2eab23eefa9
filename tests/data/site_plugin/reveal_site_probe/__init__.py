"""A tiny out-of-tree plugin, as a site would write one: one probe, one hint rule."""
import itertools

from reveal_plugins.hooks import hookimpl
from reveal_plugins.probes.probe import Probe
from reveal_plugins.types import ChannelMeta


class SiteProbe(Probe):
    name = "site.heartbeat"

    def open(self):
        self._n = itertools.count()
        self._ready([ChannelMeta("system.site.heartbeat", "count", "counter", self.name)])

    def sample(self):
        return [float(next(self._n))]


@hookimpl
def reveal_register_probes(config):
    return [SiteProbe()]
