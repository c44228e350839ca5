"""HDEE: heterogeneous domain-expert ensembles (arXiv 2502.19385).

plan            the ensemble plan (seeds, expert lanes, widths, steps) and its validation
compute_budget  compute matching, sum_j 6 * N_j * D_j against a homogeneous baseline
mixing          ensemble weightings over per-token expert log-probs, and the cached prior
config          the typed run config (Hydra schema `hdee_schema`) and the pre-training checks
train           seed training and expert branching on the shared Trainer
jobs            seeds and lanes as independent local processes
evaluate        expert-parallel ensemble evaluation and text scoring
router          the closed-form ridge-regression router (DUME) and its per-class statistics
checkpoints     the models a merge reads and loads: whole, finite, compatible, of a size that fits
routed          the experts merged into one routed causal LM (a PreTrainedModel with its own config)
merge           building the routed model of a trained ensemble (the hdee_merge recipe's job)
"""
