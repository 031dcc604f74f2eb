"""Strict input for the API: what the schema does not allow gets a 400, never a guess.

DRF and django-filter are lenient by default: an unknown body field is dropped
(a typo such as ``period_start`` then starts a whole-lake report), ``"0"`` is
accepted where a boolean is documented, ``comment: 0`` becomes the text "0",
and a filter value that cannot be read (``active=-1``, ``since=``) is quietly
ignored, listing everything. Here each of those is refused with a message
naming the parameter. The dashboard's filter forms are not affected: they send
empty fields for "any", and only the API goes through :class:`StrictFilterBackend`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.db.models import QuerySet
from django_filters import filters as plain_filters
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

#: query-string spellings of a boolean the API accepts
BOOLEAN_WORDS = {"true": True, "false": False, "1": True, "0": False}
_POSITIVE = re.compile(r"[0-9]{1,9}")
#: the highest page number the API reads (nine digits)
MAX_PAGE = 999_999_999


class StrictSerializer(serializers.Serializer):
    """A request body: a JSON object with no field the serializer does not declare."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                known = ", ".join(self.fields) or "none"
                raise ValidationError(
                    {name: [f"unknown field (this request takes: {known})"] for name in unknown}
                )
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """JSON true or false only (DRF also takes "yes", 1, "on" ...)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string only (DRF also turns numbers into text)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only (DRF also reads "5" and 5.0)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter for the API, refusing filter values it would otherwise ignore:
    an empty value and a boolean that is not true/false/1/0. Values of the wrong
    type for the other filters (times, numbers, choices) already fail the filter
    set's form, which the backend turns into a 400."""

    def filter_queryset(self, request: Request, queryset: QuerySet, view: Any) -> QuerySet:
        filterset_class = self.get_filterset_class(view, queryset)
        if filterset_class is not None:
            check_filter_values(request.query_params, filterset_class.base_filters)
        return super().filter_queryset(request, queryset, view)


def check_filter_values(params: Mapping[str, Any], declared: Mapping[str, Any]) -> None:
    problems: dict[str, list[str]] = {}
    for name, flt in declared.items():
        if name not in params:
            continue
        for value in params.getlist(name) if hasattr(params, "getlist") else [params[name]]:
            if value == "":
                problems[name] = ["empty value: give one, or leave the parameter out"]
            elif (
                isinstance(flt, plain_filters.BooleanFilter)
                and str(value).lower() not in BOOLEAN_WORDS
            ):
                problems[name] = [f"{value!r} is not a boolean (true or false)"]
    if problems:
        raise ValidationError(problems)


class StrictPagination(PageNumberPagination):
    """``page`` and ``page_size`` must be positive integers (``page_size`` at most
    :attr:`max_page_size`): DRF would quietly use the default size for a bad one."""

    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not _POSITIVE.fullmatch(raw) or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError(
                {"page_size": [f"must be a whole number from 1 to {self.max_page_size}"]}
            )
        return int(raw)

    def get_page_number(self, request: Request, paginator: Any) -> Any:
        raw = request.query_params.get(self.page_query_param, 1)
        if raw in self.last_page_strings:
            return raw
        if raw != 1 and (not _POSITIVE.fullmatch(str(raw)) or int(raw) < 1):
            raise ValidationError({"page": ["must be a whole number from 1 (or 'last')"]})
        return raw

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            schema = parameter.setdefault("schema", {})
            schema["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                schema["maximum"] = self.max_page_size
            else:
                schema["maximum"] = MAX_PAGE
        return parameters
