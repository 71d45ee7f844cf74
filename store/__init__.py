"""The ftui store: runs, per-step metrics, device samples and events in one SQL database."""

from store.curves import Curve
from store.engine import StoreError
from store.records import (
    EventInfo,
    MetricPoint,
    NamedMetricPoint,
    ProcessSampleInfo,
    RunInfo,
    RunUpdate,
    SampleInfo,
)
from store.store import Store

__all__ = ["Curve", "EventInfo", "MetricPoint", "NamedMetricPoint", "ProcessSampleInfo", "RunInfo", "RunUpdate", "SampleInfo",
           "Store", "StoreError"]
