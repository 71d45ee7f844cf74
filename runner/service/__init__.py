"""The use cases every front end calls: launch, resume, sweep, the batch-size finder, stop and recover.
The CLI and the dashboard parse, call one of these and render; they compose nothing themselves."""
