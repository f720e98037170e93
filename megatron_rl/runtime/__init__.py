"""Runtime helpers usable by every layer (imports no upper layer): device, process setup, launch checks, disk space, memory watch, console, logging, usage errors."""
