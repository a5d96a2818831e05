"""A structural snapshot of a graphile-worker schema, read from the catalogs.

Two databases have the same schema when their snapshots are equal: tables,
columns (type, default, nullability, generation, identity), constraints,
indexes, views, types, sequences, functions, triggers, policies and the
migrations record. Python-only objects (``_private_py_*``, ``py_*``) are left
out, as the contract allows them, unless ``python_objects`` asks for them
too (with every function's definition and the Python-only migrations record).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

_QUERIES: dict[str, str] = {
    "relations": """
        select c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity
        from pg_class c
        where c.relnamespace = %(schema)s::regnamespace
          and c.relname not like '\\_private\\_py\\_%%'
        order by 1
    """,
    "columns": """
        select c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid), a.attgenerated, a.attidentity,
               a.attcollation
        from pg_attribute a
        join pg_class c on c.oid = a.attrelid
        left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
        where c.relnamespace = %(schema)s::regnamespace
          and c.relkind in ('r', 'v', 'c')
          and c.relname not like '\\_private\\_py\\_%%'
          and a.attnum > 0 and not a.attisdropped
        order by 1, 2
    """,
    "constraints": """
        select c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid),
               k.condeferrable, k.condeferred
        from pg_constraint k
        join pg_class c on c.oid = k.conrelid
        where k.connamespace = %(schema)s::regnamespace
          and c.relname not like '\\_private\\_py\\_%%'
        order by 1, 2
    """,
    "indexes": """
        select i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        from pg_index i
        join pg_class c on c.oid = i.indrelid
        join pg_class ic on ic.oid = i.indexrelid
        where c.relnamespace = %(schema)s::regnamespace
          and c.relname not like '\\_private\\_py\\_%%'
          and ic.relname not like '\\_private\\_py\\_%%'
        order by 1
    """,
    "views": """
        select c.relname, pg_get_viewdef(c.oid)
        from pg_class c
        where c.relnamespace = %(schema)s::regnamespace and c.relkind = 'v'
        order by 1
    """,
    "types": """
        select t.typname, t.typtype, t.typcategory
        from pg_type t
        where t.typnamespace = %(schema)s::regnamespace
          and t.typname not like '\\_private\\_py\\_%%'
          and t.typname not like '\\_\\_private\\_py\\_%%'
        order by 1
    """,
    "sequences": """
        select s.seqrelid::regclass::text, format_type(s.seqtypid, null), s.seqstart,
               s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle,
               (select a.attrelid::regclass::text || '.' || a.attname
                from pg_depend d
                join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid
                where d.objid = s.seqrelid and d.deptype in ('a', 'i'))
        from pg_sequence s
        join pg_class c on c.oid = s.seqrelid
        where c.relnamespace = %(schema)s::regnamespace
          and c.relname not like '\\_private\\_py\\_%%'
        order by 1
    """,
    "functions": """
        select p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid),
               l.lanname, p.provolatile, p.proisstrict, p.prosecdef, p.proretset,
               p.proconfig, p.proparallel, p.proleakproof
        from pg_proc p
        join pg_language l on l.oid = p.prolang
        where p.pronamespace = %(schema)s::regnamespace
          and p.proname not like 'py\\_%%'
        order by 1, 2
    """,
    "triggers": """
        select c.relname, t.tgname, pg_get_triggerdef(t.oid)
        from pg_trigger t
        join pg_class c on c.oid = t.tgrelid
        where c.relnamespace = %(schema)s::regnamespace and not t.tgisinternal
        order by 1, 2
    """,
    "policies": """
        select c.relname, p.polname
        from pg_policy p join pg_class c on c.oid = p.polrelid
        where c.relnamespace = %(schema)s::regnamespace
        order by 1, 2
    """,
    "migrations": "select id, breaking from {migrations} order by id",
}


#: With ``python_objects``: each function's whole definition (body, settings),
#: and the Python-only migrations recorded.
_PYTHON_QUERIES: dict[str, str] = {
    "function_definitions": """
        select p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
        from pg_proc p
        where p.pronamespace = %(schema)s::regnamespace
        order by 1, 2
    """,
    "py_migrations": "select id from {py_migrations} order by id",
}

# The conditions of _QUERIES that leave out Python-only objects.
_PYTHON_FILTER = re.compile(r"\n\s*and [\w.]+ not like '[^']*py[^']*'")


def snapshot(
    conninfo: str, schema: str = "graphile_worker", *, python_objects: bool = False
) -> dict[str, list[tuple[Any, ...]]]:
    """Read the snapshot of ``schema``; the schema name itself is masked out.
    ``python_objects``: Python-only objects too, and function definitions."""
    result: dict[str, list[tuple[Any, ...]]] = {}
    quoted = psycopg.sql.Identifier(schema)
    queries = dict(_QUERIES)
    if python_objects:
        queries = {name: _PYTHON_FILTER.sub("", query) for name, query in queries.items()}
        queries.update(_PYTHON_QUERIES)
    with psycopg.connect(conninfo) as conn:
        quoted_text = quoted.as_string(conn)
        for name, query in queries.items():
            if name in ("migrations", "py_migrations"):
                statement = psycopg.sql.SQL(query).format(
                    migrations=psycopg.sql.Identifier(schema, "migrations"),
                    py_migrations=psycopg.sql.Identifier(schema, "_private_py_migrations"),
                )
                rows = conn.execute(statement).fetchall()
            else:
                rows = conn.execute(query, {"schema": quoted_text}).fetchall()  # type: ignore[arg-type]
            result[name] = [
                tuple(
                    v.replace(quoted_text + ".", "SCHEMA.").replace(schema + ".", "SCHEMA.")
                    if isinstance(v, str)
                    else tuple(v)
                    if isinstance(v, list)
                    else v
                    for v in row
                )
                for row in rows
            ]
    return result


def differences(left: dict[str, list[Any]], right: dict[str, list[Any]]) -> list[str]:
    """Human-readable lines describing how two snapshots differ (empty: identical)."""
    lines = []
    for key in left.keys() | right.keys():
        a, b = set(left.get(key, [])), set(right.get(key, []))
        lines += [f"{key}: only in ours:   {row}" for row in sorted(a - b, key=repr)]
        lines += [f"{key}: only in theirs: {row}" for row in sorted(b - a, key=repr)]
    return lines
