"""The watcher of one run on this machine: pre-flight, preparing (record and run folder), spawning the
process group, following its journal into the store, telemetry and hang detection, crash reasons, the
end status, and the background watcher process."""
