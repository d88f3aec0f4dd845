"""OpenAI's Batch API: a batch's record, validation of its input file, the feeder that runs its
lines on spare capacity, and its output files."""
