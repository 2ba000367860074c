"""The console's routes: what answers each path (contract §9 names the ones other tools may rely on)."""

from __future__ import annotations

from starlette.routing import Route

from service.console.actions import annotate, release, reprocess, resolve, retry_effect
from service.console.edits import decide_edit, edit, edit_form, edit_page
from service.console.login import favicon, healthz, login, login_form, logout, readyz
from service.console.pages import (
    api_quarantine,
    api_record,
    api_stats,
    audit_page,
    effect_detail,
    effects_list,
    held_key,
    held_keys,
    launch_status,
    overview,
    quarantine_list,
    quarantine_record,
    reveal,
    run_detail,
    runs_list,
)
from service.console.processes import api_processes, processes_page

ROUTES = [
    Route("/healthz", healthz),
    Route("/favicon.ico", favicon),
    Route("/readyz", readyz),
    Route("/login", login_form, methods=["GET"]),
    Route("/login", login, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
    Route("/", overview),
    Route("/quarantine", quarantine_list),
    Route("/quarantine/{failure_id:path}", quarantine_record),
    Route("/keys", held_keys),
    Route("/keys/detail", held_key),
    Route("/effects", effects_list),
    Route("/effects/{key:path}", effect_detail),
    Route("/runs", runs_list),
    Route("/runs/{run_id}", run_detail),
    Route("/launches/{launch}", launch_status),
    Route("/audit", audit_page),
    Route("/edits/{edit_id}", edit_page),
    Route("/processes", processes_page),
    Route("/api/quarantine", api_quarantine),
    Route("/api/quarantine/{failure_id:path}", api_record),
    Route("/api/stats", api_stats),
    Route("/api/processes", api_processes),
    Route("/actions/reveal", reveal, methods=["POST"]),
    Route("/actions/annotate", annotate, methods=["POST"]),
    Route("/actions/resolve", resolve, methods=["POST"]),
    Route("/actions/reprocess", reprocess, methods=["POST"]),
    Route("/actions/release", release, methods=["POST"]),
    Route("/actions/retry", retry_effect, methods=["POST"]),
    Route("/actions/open-edit", edit_form, methods=["POST"]),
    Route("/actions/edit", edit, methods=["POST"]),
    Route("/actions/decide-edit", decide_edit, methods=["POST"]),
]
