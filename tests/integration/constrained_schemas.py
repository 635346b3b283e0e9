"""The JSON schemas the constrained-generation tests run on every API (gRPC, the OpenAI routes, the
Python client, resumed blobs), and the one check every output of them must pass: the strict JSON
parser (json.loads refuses control characters inside strings) and jsonschema with its format
checker (dates, UUIDs and addresses are checked, not just typed as strings).

Ten shapes: nested objects, arrays, enums, `required` with optional siblings, string formats and
patterns, integers and numbers with bounds, bounded strings. Sized so that the shipped byte-level
tost-austen completes most of them within the tests' token budget under sampling."""
import json

import jsonschema

SCHEMAS = {
    "nested_object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 16},
                    "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
                },
                "required": ["city", "zip"],
            },
        },
        "required": ["name", "address"],
    },
    "array_of_enums": {
        "type": "object",
        "properties": {
            "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
        },
        "required": ["colours"],
    },
    "bounds": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "title": {"type": "string", "maxLength": 12},
            "married": {"type": "boolean"},
        },
        "required": ["age", "title", "married"],
    },
    "string_formats": {
        "type": "object",
        "properties": {
            "born": {"type": "string", "format": "date"},
            "id": {"type": "string", "format": "uuid"},
            "host": {"type": "string", "format": "ipv4"},
        },
        "required": ["born", "id", "host"],
    },
    "pattern_and_const": {
        "type": "object",
        "properties": {
            "kind": {"const": "letter"},
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        },
        "required": ["kind", "code"],
    },
    "number_bounds": {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9},
        },
        "required": ["ratio", "count"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "people": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                    "required": ["name", "age"],
                },
                "minItems": 1,
                "maxItems": 2,
            },
        },
        "required": ["people"],
    },
    "enum_of_mixed": {
        "type": "object",
        "properties": {
            "mood": {"enum": ["happy", "grave", 3, None, True]},
            "rank": {"type": "integer", "enum": [1, 2, 3]},
        },
        "required": ["mood", "rank"],
    },
    "optional_fields": {
        "type": "object",
        "properties": {
            "first": {"type": "string", "minLength": 1, "maxLength": 8},
            "middle": {"type": "string", "maxLength": 8},
            "last": {"type": "string", "minLength": 2, "maxLength": 8},
        },
        "required": ["first", "last"],
    },
    "top_level_array": {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 2,
        "maxItems": 5,
    },
}


def check_output(schema, text):
    """Parses `text` strictly and validates it against `schema` with format checking; raises on
    anything a strict consumer would refuse."""
    value = json.loads(text)  # strict: a raw control character inside a string is refused
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return value
