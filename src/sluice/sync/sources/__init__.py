"""Change sources: each turns a source's changes into envelopes (`sluice.sync.envelope`)."""
