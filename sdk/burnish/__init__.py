"""burnish's client: group an agent's calls into trajectories, post rewards, control training."""

from burnish._api import BurnishError, MissingAdminToken, Score, StepTimeout
from burnish.client import AsyncClient, AsyncGroup, AsyncTrajectory, Client, Group, Trajectory
from burnish.current import async_http_client, http_client

__all__ = [
    "AsyncClient",
    "AsyncGroup",
    "AsyncTrajectory",
    "BurnishError",
    "Client",
    "Group",
    "MissingAdminToken",
    "Score",
    "StepTimeout",
    "Trajectory",
    "async_http_client",
    "http_client",
]
