"""The search report: one self-contained HTML page over a search's ``results.json`` and ``plans/``.

:mod:`~service.search.report.render` lays the page out (header, ranking, plots, the winner's plan) from
:mod:`~service.search.report.table` (the ranking), :mod:`~service.search.report.plots` (inline SVG),
:mod:`~service.search.report.plan` (the winner's placements, collectives and memory),
:mod:`~service.search.report.format` (numbers and escaping) and :mod:`~service.search.report.assets` (style
sheet and sorting script); :mod:`~service.search.report.page` is what the CLI, the search job and the service
call, importing the rest (and matplotlib) only when a page is written.
"""
