#!/usr/bin/env bash
# The fused all-reduce + residual + RMSNorm simulation (sim_fused.cu): build_and_run.sh with
# SIM_NAME=sim_fused; the same options.
exec env SIM_NAME=sim_fused "$(dirname "$0")/build_and_run.sh" "$@"
