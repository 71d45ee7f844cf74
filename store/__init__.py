"""The ftui store: runs, per-step metrics, device samples and events in one SQL database."""

from store.store import (
    EventInfo,
    MetricPoint,
    NamedMetricPoint,
    ProcessSampleInfo,
    RunInfo,
    RunUpdate,
    SampleInfo,
    Store,
    StoreError,
)

__all__ = ["EventInfo", "MetricPoint", "NamedMetricPoint", "ProcessSampleInfo", "RunInfo", "RunUpdate", "SampleInfo", "Store", "StoreError"]
