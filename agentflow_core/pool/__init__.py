"""Env pools and the variant scheduler that feeds them.

Import pools from their modules (``agentflow_core.pool.inprocess``, ``agentflow_core.pool.ray_pool``)
so importing the package does not pull in Ray.
"""

from agentflow_core.pool.scheduler import BaseScheduler, EpisodeStats, HeatTracker, Scheduler
from agentflow_core.pool.strategies import STRATEGIES, make_scheduler

__all__ = ["STRATEGIES", "BaseScheduler", "EpisodeStats", "HeatTracker", "Scheduler", "make_scheduler"]
