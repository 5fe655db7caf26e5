"""The batched run model's decisions, orchestrator-neutral: plain values and ``now`` in, plain decisions
out (ARCHITECTURE.md §6.1). The Dagster adapter (``dagster_defs``) maps them onto runs, tags and cursors."""

from cq_engine.scheduling.lead import HORIZON_LEAD, MAX_HORIZON_SECONDS, batch_horizon, batch_lead, env_seconds

__all__ = ["HORIZON_LEAD", "MAX_HORIZON_SECONDS", "batch_horizon", "batch_lead", "env_seconds"]
