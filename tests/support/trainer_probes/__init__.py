"""Scripts the trainer tests run inside dev/trainers' environments (their own
interpreters: torch, TRL, verl and ART are no dependency of the package). Each reads
its arguments as JSON from argv and prints one JSON object, its findings."""
