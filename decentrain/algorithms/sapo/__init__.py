"""SAPO: swarm RL where nodes share decoded rollouts (arXiv 2509.08721).

Every module of the package, in the order a round reads (import them directly; this package
imports nothing):

One round
  rounds          the round loop around one node: exchange, metrics, checkpoint and resume, held-out eval
  node            one node's round: generate, share, build the I+J batch, the policy step
  inbox           what a node takes from its peers: records in, scored arrivals out (decode, budget, clip,
                  dedupe, rebuild, align, score), every drop counted
  batching        I local + J external groups (a fair share of J per sender), re-tokenised by the receiver
  grpo            SAPOLossConfig, the clipped-ratio loss, `group` / `spo` advantages

Generating
  sampling        the `sampling` config, the generation backend interface and its registry
  generation      the HF backend (`hf`), completion log-probs, a completion cut to a token budget
  vllm_backend    the optional vLLM backend (`vllm`)
  prompts         plain and chat templates, free-form answer extraction, the end of a turn as text

What peers send, and what it may cost
  payload         versioned, bounded, signed rollout payloads (+ optional swarm-key HMAC), replay marks
  offpolicy       a sender's optional log-probs: their wire checks, tokenizer fingerprint and alignment
  sender_budget   what one sender, and all senders together, may cost this node per round
  exchange/       the exchange backends (silo, collective, hivemind), each its own module, and their registry
  dht_guard       what a node lets into, and takes out of, a hivemind DHT shared with strangers
  peer_selection  which listed peers a hivemind node reads each round

Configuration, evaluation, results, warm start
  config          SAPOConfig (with per-node overrides) and SFTConfig, typed from Hydra's dict
  config_checks   every number of a SAPO config finite and in range, before any node starts
  evaluation      held-out greedy accuracy (RLEvalConfig)
  results         the per-round console line, and summary.json and reward.png per node
  sft             the warm start: SFT with the loss on answer tokens only

A node's identity (its Ed25519 key, the wire id, and safe node names) is `decentrain.core.identity`.
"""
