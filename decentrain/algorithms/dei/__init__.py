"""DEI: distributed quality-diversity search in Core War with a different language model per node.

Per node (DRQ, arXiv 2601.03335): rounds of MAP-Elites (`archive.py`, pyribs) in which a
language model (`operators.py`) writes and rewrites Redcode warriors, parsed strictly
(`redcode.py`) and battled in pMARS (`pmars.py`) against every earlier round's champion. Across
nodes (DEI, Donaghy and Rastogi 2026): each round's best elites are shared through the job's
store with a deadline (`sharing.py`) and seed the peers' next round (`node.py`).
"""
