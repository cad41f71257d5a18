"""The admin API's project settings: retention (``core/platform/retention.py``).

``GET`` and ``PUT /admin/projects/{project}/retention``: how long the project's trajectories
are kept after their last call or reward, which ``burnish db prune`` applies. Admin only,
like the rest of ``/admin`` (``gateway/routes/admin.py``).
"""

from __future__ import annotations

from litestar import Router, get, put
from litestar.di import NamedDependency
from litestar.params import JSONBody

from burnish_server.core.platform.retention import Retention, RetentionView, effective
from burnish_server.gateway.access.admission import ACCESS_ERRORS as ACCESS
from burnish_server.gateway.access.admission import BEARER
from burnish_server.gateway.edge.errors import responses
from burnish_server.gateway.routes.common import ProjectId
from burnish_server.gateway.services import Services
from burnish_server.store import retention as store


async def _view(svc: Services, project: str) -> RetentionView:
    setting, updated_at = await svc.db.read(store.get_retention, project)
    days, source = effective(setting, svc.settings.retention_days)
    return RetentionView(
        project=project,
        days=setting.days if setting else None,
        prune_trained=setting.prune_trained if setting else False,
        effective_days=days,
        source=source,
        updated_at=updated_at,
    )


@get("/{project:str}/retention", responses=responses(400, *ACCESS))
async def get_retention(project: ProjectId, svc: NamedDependency[Services]) -> RetentionView:
    """The project's retention, and what `burnish db prune` applies to it (its own days, else
    this gateway's BURNISH_RETENTION_DAYS; null: nothing is removed)."""
    return await _view(svc, project)


@put("/{project:str}/retention", opt={"invalid": "invalid_retention"}, responses=responses(400, *ACCESS, 413))
async def set_retention(project: ProjectId, data: JSONBody[Retention], svc: NamedDependency[Services]) -> RetentionView:
    """Set the project's retention: keep a trajectory `days` after its last call or reward (null:
    the server's default), and whether what a kept version trained on goes too. Nothing is
    removed until `burnish db prune` runs."""
    await svc.db.transaction(store.set_retention, project, data)
    return await _view(svc, project)


router = Router(path="/admin/projects", opt={"scope": "admin"}, security=BEARER, route_handlers=[get_retention, set_retention], tags=["admin"])
