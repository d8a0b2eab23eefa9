"""Peers: the odd node out of a multi-node job, and the job report across its nodes."""
