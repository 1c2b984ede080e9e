"""rollout-fleet operator: reconciles shard and environment-server resources into a fleet's healthy set."""
