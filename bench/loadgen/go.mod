module rollout-fleet/bench/loadgen

go 1.21
