"""Moving bytes between ranks: transports, pair groups, pairing and pair exchange, wire format, deadlines
and wait policy, membership, the job store, the heal authority (incarnation.py), heal transfer and ensemble
dispatch."""
