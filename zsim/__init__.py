"""zsim: a discrete-event cluster simulator and memory/communication planner for sharded
data-parallel training. The entry points are zsim.api, zsim.calibrate_api and
zsim.validate_api (what the `zsim` command calls) and zsim.simulate.simulate; this file
imports nothing, so that importing one subpackage (the engine needs only simpy) never
pulls in the rest."""
