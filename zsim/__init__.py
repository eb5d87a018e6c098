"""zsim: a discrete-event cluster simulator and memory/communication planner for sharded
data-parallel training. The entry points are zsim.api, zsim.calibrate_api and
zsim.validate_api (what the `zsim` command calls) and zsim.simulate.simulate; this file
imports nothing, so that importing one subpackage (the engine needs only simpy) never
pulls in the rest.

Vocabulary. These words mean one thing each in zsim; they are stated here once, and other
docstrings point here rather than define them again.

- strategy (Plan.strategy): what the data-parallel ranks shard. ddp: nothing; zero1: the
  optimizer state; zero2: + the gradients; zero3, fsdp, fsdp-no-reshard: + the
  parameters; hsdp: as fsdp inside a shard group, replicated across groups. Each
  strategy's FSDP2 counterpart is tabled in zsim.spec.plan.
- program (Plan.impl; `--impl` on the command line): the library that runs a strategy.
  torch: DistributedDataParallel (+ ZeroRedundancyOptimizer for zero1); fsdp2:
  fully_shard; fsdp1: FullyShardedDataParallel; deepspeed: DeepSpeed's ZeRO. The program
  registry (zsim.spec.programs) names every program once, with its facts: the strategies
  it runs (a strategy may run under several, one its default), its options (Plan.options),
  its modules; each program's op order is one module of zsim.schedule.programs, its real
  run one of zsim.backend. A plan's label names a program other than the default in
  brackets: `fsdp[fsdp1]`.
- check vs validate: checking a plan (zsim.spec.consistency.check_plan) refuses a model,
  hardware and plan that cannot go together, before anything is simulated (a
  ConfigError). Validating (`zsim validate`, zsim.validation) runs a plan for real and
  compares the measurements with zsim's predictions; "validation" means only that.
- pipeline: always pipeline parallelism (Plan.pp: consecutive blocks as stages on
  different ranks). Three modules deal with it: the order in which each pipeline rank
  runs its micro-batches' forwards and backwards under a pipeline schedule (1f1b,
  interleaved, gpipe; zsim.schedule.pipeline_order), each stage's work and memory
  (zsim.schedule.pipeline_work), and the replay of the orders in time, where the bubble
  emerges (zsim.engine.pipeline_replay).
- simulate vs replay: to replay is to run a fixed order of ops through simulated time
  (zsim.engine.replay for one step's schedule, zsim.engine.pipeline_replay for a
  pipeline's orders); to simulate a plan (zsim.simulate.simulate) is to check it, lower
  it (to one step's schedule, or with pp > 1 to its pipeline's orders and stages' work),
  replay that and summarize it into a Result.
- axis vs dim: an axis is an axis of the device mesh (tp, cp, pp, dp_shard,
  dp_replicate; its size is the plan's degree of that name; zsim.analytic.placement); a
  dim is a tensor dimension (d_model, the sequence). A mesh has axes, a tensor dims.
- busy vs exposed (Calculon's words): busy time is when a stream or link was occupied
  (the union of its intervals, overlapped or not); exposed time lies on the step's
  critical path: the compute stream sat idle waiting for a collective (exposed
  communication) or for the host. Results report both (zsim.result).
"""
