"""The scheduler: which requests compute what in each step. Scheduler is its one door; its state and
its managers (the private modules) are its own: nothing outside this package reads or changes
them."""

from warmpath.engine.scheduler.batch import ScheduledChunk, SchedulerStats, StepBatch
from warmpath.engine.scheduler.scheduler import Scheduler

__all__ = ["ScheduledChunk", "Scheduler", "SchedulerStats", "StepBatch"]
