"""The node agent: sampler, run registry, socket server, housekeeping, live loop; and its protocol, client and pending queue."""
