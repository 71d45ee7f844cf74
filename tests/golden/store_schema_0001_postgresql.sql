-- The schema ftui 0.1.0 made with create_all before migrations existed (store/models.py at 5cf4036),
-- compiled for postgresql. A database made by that code; tests open it with today's Store.

CREATE TABLE runs (
	id SERIAL NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	sweep_id VARCHAR(64), 
	recipe_text TEXT NOT NULL, 
	recipe_hash VARCHAR(64) NOT NULL, 
	recipe_source VARCHAR(1000), 
	strategy VARCHAR(32) NOT NULL, 
	nproc INTEGER NOT NULL, 
	method VARCHAR(16) NOT NULL, 
	model VARCHAR(500) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	distributed_type VARCHAR(32), 
	device_type VARCHAR(16), 
	host VARCHAR(255) NOT NULL, 
	run_dir VARCHAR(1000) NOT NULL, 
	pgid INTEGER, 
	created_at TIMESTAMP WITHOUT TIME ZONE NOT NULL, 
	started_at TIMESTAMP WITHOUT TIME ZONE, 
	ended_at TIMESTAMP WITHOUT TIME ZONE, 
	exit_code INTEGER, 
	error TEXT, 
	total_steps INTEGER, 
	steps_done INTEGER, 
	train_seconds FLOAT, 
	tokens_per_s FLOAT, 
	final_loss FLOAT, 
	peak_mem_bytes INTEGER, 
	mean_util FLOAT, 
	summary JSON NOT NULL, 
	tags JSON NOT NULL, 
	note TEXT NOT NULL, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_runs_status ON runs (status);

CREATE INDEX ix_runs_sweep ON runs (sweep_id);

CREATE TABLE device_samples (
	id SERIAL NOT NULL, 
	run_id INTEGER NOT NULL, 
	time FLOAT NOT NULL, 
	host VARCHAR(255) NOT NULL, 
	kind VARCHAR(8) NOT NULL, 
	index INTEGER NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	util_pct FLOAT, 
	mem_used INTEGER, 
	mem_total INTEGER, 
	power_w FLOAT, 
	temp_c FLOAT, 
	sm_clock_mhz INTEGER, 
	pid INTEGER, 
	source VARCHAR(16) NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE INDEX ix_device_samples_run_time ON device_samples (run_id, time);

CREATE TABLE events (
	id SERIAL NOT NULL, 
	run_id INTEGER NOT NULL, 
	source VARCHAR(16) NOT NULL, 
	seq INTEGER NOT NULL, 
	type VARCHAR(32) NOT NULL, 
	time FLOAT NOT NULL, 
	payload JSON NOT NULL, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_events_run_source_seq UNIQUE (run_id, source, seq), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE INDEX ix_events_run ON events (run_id);

CREATE TABLE metrics (
	id SERIAL NOT NULL, 
	run_id INTEGER NOT NULL, 
	step INTEGER NOT NULL, 
	time FLOAT NOT NULL, 
	loss FLOAT, 
	lr FLOAT, 
	grad_norm FLOAT, 
	tokens INTEGER, 
	step_time FLOAT, 
	tokens_per_s FLOAT, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_metrics_run_step UNIQUE (run_id, step), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE TABLE process_samples (
	id SERIAL NOT NULL, 
	run_id INTEGER NOT NULL, 
	time FLOAT NOT NULL, 
	host VARCHAR(255) NOT NULL, 
	gpu_index INTEGER NOT NULL, 
	pid INTEGER NOT NULL, 
	rank INTEGER, 
	used_bytes INTEGER, 
	source VARCHAR(16) NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);

CREATE INDEX ix_process_samples_run_time ON process_samples (run_id, time);
