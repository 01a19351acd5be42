"""What-if commands over the latency model: `specwatch predict | sweep | advise`."""
