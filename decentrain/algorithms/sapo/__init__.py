"""SAPO: swarm RL where nodes share decoded rollouts (arXiv 2509.08721).

Modules (import them directly; this package imports nothing heavy):
  identity    Ed25519 node keys (the wire id), safe node names
  payload     versioned, bounded, signed rollout payloads (+ optional swarm-key HMAC), replay marks
  grpo        SAPOLossConfig, the clipped-ratio loss, `group` / `spo` advantages
  batching    I local + J external groups, re-scored and re-tokenised by the receiver
  generation  GenerationBackend protocol, HF backend, completion log-probs
  prompts     plain and chat templates, free-form answer extraction, the end of a turn as text
  exchange    rollout exchange backends: silo, collective (all_gather of bytes), hivemind (DHT)
  config      SAPOConfig (with per-node overrides), SFTConfig, Hydra schema registration
  node        one node's round: generate, share, build the I+J batch, policy step
  rounds      the round loop: metrics, checkpoint and resume
  sft         the warm start: SFT with the loss on answer tokens only
"""
