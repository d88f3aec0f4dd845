"""Jobs: admission and enqueue, owner checks and cancellation, records, the prompt-fit check,
model routing and the API's share of lease reaping."""
