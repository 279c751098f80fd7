"""OpenLineage events of our tasks, through Airflow's OpenLineage provider (the `[openlineage]` extra).

The operators' `get_openlineage_facets_on_start/on_complete/on_failure` import `lineage` here,
and only when the provider's listener asks: without the provider nothing calls them, and DAG
parsing never imports this package. `naming` holds the dataset names (no OpenLineage import);
`facets` our custom facets; `lineage` what each task reports, built from the payloads it already
returns. docs/lineage.md lists every dataset and facet.
"""
