#!/usr/bin/env bash
# Resuming and importing, as commands (run them one by one; JOB is a job id
# from `shardctl jobs`, STEP_DIR a committed step folder from `ckpt list`).
set -euo pipefail

# A job's latest checkpoint, as a new job: any world size, any strategy.
shardctl resume "$JOB" --workers 1 --strategy no_shard --follow

# Any committed step folder, under a job file of the same model (other
# steps, schedule or data are fine; another model is refused).
shardctl submit "$JOB_FILE" --resume-from "$STEP_DIR" --follow

# A PyTorch Distributed Checkpoint that FSDP2 or torchtitan saved, as a
# checkpoint Shardline resumes from (the model and its AdamW state).
shardctl ckpt import "$DCP_DIR" --job "$JOB_FILE" --out imported
shardctl submit "$JOB_FILE" --resume-from imported/step-* --follow

# And back: the checkpoint as DCP, which dcp.load reads into FSDP2 at any
# world size.
shardctl ckpt export "$STEP_DIR" --format dcp --job "$JOB_FILE" --out dcp-out
