"""What makes a job resumable: complete checkpoints (checkpoint, compression), loads that never
unpickle (safe_load), the RNG streams (seeding), SIGTERM as a preemption notice (preemption),
and the named crash points the resume tests use (faults)."""
