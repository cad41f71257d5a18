"""burnish's domain: policies and their settings, recorded calls, group states, settings, errors.

The bottom layer. It imports the standard library and msgspec only: no web framework, no
database, no torch. Every other layer imports it; it imports none of them.

Four rooms, each importing only the rooms below it (``make lint`` checks it):

    api/        what the JSON APIs answer and what a list is narrowed to: names every room below
    learning/   policies, versions, groups, credit, steps, health
    protocols/  the wire: surfaces, translators, the recorded call
    platform/   settings, errors, ids, access, sessions, logs, retention, the archive, replicas
"""
