"""forensics/fleet/prom.py's pure parts (windows, label names and escaping, selectors, sample and count values) and
its client and table against a real small HTTP server on 127.0.0.1 that answers as Prometheus' API would, or as a
broken or hostile one might: every wrong answer is one clear PrometheusError, never a traceback."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from forensics.errors import EXIT_ERROR, EXIT_USAGE, PrometheusError, SelectorError
from forensics.fleet.prom import (PromClient, _count_value, _esc, _sample_value,
                                 parse_window, prom_label, selector_matchers, summarize_fleet_prometheus)


@pytest.mark.parametrize("text, seconds", [("6h", 21600), ("90m", 5400), ("1d12h", 129600), ("2w", 1209600),
                                           (" 45s ", 45), ("1h30m15s", 5415)])
def test_a_window_is_a_prometheus_duration(text, seconds):
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", " ", "6", "6x", "h", "0h", "0s", "-1h", "1.5h", "6h 30m", "30m6h", "six hours"])
def test_anything_else_is_not_a_window(text):
    with pytest.raises(ValueError):
        parse_window(text)


def test_label_names_are_kube_state_metrics_names():
    assert prom_label("nvidia.com/gpu.product") == "label_nvidia_com_gpu_product"
    assert prom_label("app.kubernetes.io/name") == "label_app_kubernetes_io_name"
    assert prom_label("a-b_c9") == "label_a_b_c9"


@pytest.mark.parametrize("raw, escaped", [('a"b', 'a\\"b'), ("a\\b", "a\\\\b"), ("a\nb", "a\\nb"),
                                          ('\\"', '\\\\\\"'), ("plain", "plain")])
def test_a_value_is_escaped_for_a_promql_string(raw, escaped):
    assert _esc(raw) == escaped
    # read back as PromQL reads a double-quoted string (Go's escapes): the same value
    assert json.loads(f'"{escaped}"') == raw


@pytest.mark.parametrize("selector, matchers", [
    ("app=x", [("label_app", '="x"')]),
    ("app==x", [("label_app", '="x"')]),
    ("app!=x", [("label_app", '!="x"')]),
    ("env in (a,b.c)", [("label_env", '=~"a|b\\\\.c"')]),
    ("env notin ( a , b )", [("label_env", '!~"a|b"')]),
    ("app", [("label_app", '!=""')]),
    ("!app", [("label_app", '=""')]),
    ("example.com/team=gpu, !canary", [("label_example_com_team", '="gpu"'), ("label_canary", '=""')]),
])
def test_a_selector_becomes_exact_matchers(selector, matchers):
    assert selector_matchers(selector) == matchers


@pytest.mark.parametrize("selector", ["", "app=", "app!=", "env in (a,)", "env in ()", "x>1", "x<1", "!x=1",
                                      "a b", "a=b c", "a=b,", ",", 'a="b"', "a=b\\c", "-a=b", "a/=b", "a=" + "b" * 64,
                                      "env in (a"])
def test_a_selector_that_cannot_be_asked_exactly_is_a_usage_error(selector):
    with pytest.raises(SelectorError) as e:
        selector_matchers(selector)
    assert e.value.exit_code == EXIT_USAGE == 2
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize("sample, value", [([1, "3"], 3.0), ([1.5, "0.25"], 0.25), (["1", "-2"], -2.0)])
def test_a_sample_is_time_and_a_finite_value(sample, value):
    assert _sample_value("q", sample) == value


@pytest.mark.parametrize("sample", [None, [], [1], [1, 2], [1, "3", 4], {"v": "1"}, "1", [1, "NaN"], [1, "+Inf"],
                                    [1, "-Inf"], [1, "many"], [1, None], [1, ["1"]]])
def test_anything_else_is_a_clear_error(sample):
    with pytest.raises(PrometheusError) as e:
        _sample_value("count(kube_pod_info)", sample)
    assert e.value.exit_code == EXIT_ERROR and "count(kube_pod_info)" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, value", [("139", 139), ("-1", -1), ("0", 0), ("1e3", 1000)])
def test_count_values_labels_are_integers(text, value):
    assert _count_value({"v": text}, "v") == value


@pytest.mark.parametrize("labels", [{}, {"v": ""}, {"v": "1.5"}, {"v": "NaN"}, {"v": "Inf"}, {"v": "x"}])
def test_a_count_values_label_that_is_no_integer_is_a_clear_error(labels):
    with pytest.raises(PrometheusError, match="not an integer"):
        _count_value(labels, "v")


class FakePrometheus:
    """A real HTTP server on 127.0.0.1 with Prometheus' API paths: ``answer(path, query) -> (status, body)``."""

    def __init__(self, answer):
        self.seen: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                query = (form.get("query") or form.get("match[]") or [""])[0]
                outer.seen.append((self.path, query))
                status, body = answer(self.path, query)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _vector(*series):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [1.0, value]} for labels, value in series]}}


@pytest.mark.parametrize("status, body, says", [
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error at char 7"}, "HTTP 400: parse error"),
    (503, b"<html>overloaded</html>", "HTTP 503: <html>overloaded</html>"),
    (200, b"not json", "not JSON"),
    (200, {"status": "success", "data": {"resultType": "scalar", "result": [1, "Inf"]}}, "finite value"),
    (200, {"status": "success", "data": {"resultType": "string", "result": [1, "x"]}}, "expected an instant vector"),
    (200, _vector(({"a": "1"}, "1"), ({"b": 2}, "1")), "labels are not strings"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, 1]}]}},
     "finite value"),
])
def test_a_wrong_answer_to_a_query_is_one_clear_error(status, body, says):
    with FakePrometheus(lambda path, q: (status, body)) as server, pytest.raises(PrometheusError) as e:
        PromClient(server.url).query("up")
    assert says in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 600


@pytest.mark.parametrize("body", [{"status": "success", "data": "label_a"},
                                  {"status": "success", "data": ["label_a", 7]},
                                  {"status": "success", "data": {"names": []}}])
def test_label_names_that_are_not_a_list_of_strings_are_one_clear_error(body):
    with FakePrometheus(lambda path, q: (200, body)) as server, \
            pytest.raises(PrometheusError, match="not a list of strings"):
        PromClient(server.url).label_names("kube_node_labels")


def test_many_series_under_the_size_bound_are_read():
    series = [({"node": f"n{i}"}, "1") for i in range(50_000)]
    with FakePrometheus(lambda path, q: (200, _vector(*series))) as server:
        assert len(PromClient(server.url).query("kube_node_labels")) == 50_000


def test_query_many_runs_queries_and_jobs_together_and_raises_the_first_error():
    with FakePrometheus(lambda path, q: (200, _vector(({}, "2")) if q == "good" else
                                              {"status": "error", "errorType": "bad_data", "error": q})) as server:
        client = PromClient(server.url)
        res = client.query_many({"a": "good", "b": lambda: client.query("good")[0][1] * 10})
        assert res == {"a": [({}, 2.0)], "b": 20.0}
        with pytest.raises(PrometheusError, match="bad_data: broken"):
            client.query_many({"a": "good", "b": "broken"})


G = {"label_nvidia_com_gpu_product": "NVIDIA-H20", "label_nvidia_com_cuda_driver_major": "580",
     "label_nvidia_com_cuda_driver_minor": "126", "label_nvidia_com_cuda_driver_rev": "09"}
ADA = {"label_nvidia_com_gpu_product": "Ada", "label_nvidia_com_cuda_driver_version_full": "570.172.08",
       "label_node_kubernetes_io_instance_type": "gpu-ada"}


def _fleet_answer(counts, nodes):
    """A Prometheus answering the table's queries of a fleet: ``counts`` for the per-pod count_values, ``nodes``
    for the nodes' one; nothing else there (no crashes, one image per container, no node label of its own)."""
    def answer(path, q):
        if path == "/api/v1/labels":
            return 200, {"status": "success", "data": ["__name__", "node", *G]}
        if q.startswith("count_values") and '"forensics_value"' in q:
            return 200, _vector(*counts)
        if q.startswith("count_values") and '"restarted"' in q:
            return 200, _vector(*nodes)
        if q.startswith("avg("):
            return 200, _vector(({}, "24"))
        return 200, _vector()
    return answer


def test_the_table_is_read_from_the_count_values_answers():
    # GIVEN H20 nodes (driver version from its parts) with 3 pods, two of them restarted 5 and 7 times, and Ada
    # nodes with 2 clean pods
    def fig(labels, figure, value, n, **extra):
        return {**labels, "forensics_figure": figure, "forensics_value": value, **extra}, n
    counts = [fig(G, "pods", "1", "3"), fig(G, "restarts", "5", "1"), fig(G, "restarts", "7", "1"),
              fig(G, "exit_code", "139", "1"), fig(G, "exit_code", "1", "1"),
              fig(G, "reason", "1", "2", reason="Error"),
              fig(G, "crash_loop", "1", "1"), fig(G, "image", "1", "3", image_id="docker-pullable://r/x@sha256:ab"),
              fig(ADA, "pods", "1", "2")]
    nodes = [({**G, "restarted": "1"}, "2"), ({**G, "restarted": "0"}, "1"), ({**ADA, "restarted": "0"}, "2")]
    with FakePrometheus(_fleet_answer(counts, nodes)) as server:
        s = summarize_fleet_prometheus(PromClient(server.url))
    # THEN the groups are counted from them
    h20, ada = s.groups
    assert h20.key == (("nvidia.com/gpu.product", "NVIDIA-H20"), ("nvidia.com/cuda.driver-version.full", "580.126.09"))
    assert (h20.nodes, h20.pods, h20.pods_with_restarts, h20.total_restarts, h20.max_restarts) == (3, 3, 2, 12, 7)
    assert h20.exit_codes == {"139": 1, "other": 1} and h20.reasons == {"Error": 2} and h20.crash_loop == 1
    assert h20.images == {"r/x@sha256:ab": 2 + 1}
    assert (ada.nodes, ada.pods, ada.pods_with_restarts) == (2, 2, 0)
    assert (s.pods, s.nodes, s.crashing_groups, s.clean_groups) == (5, 5, (h20.name,), (ada.name,))
    assert s.boundary == ("nvidia.com/gpu.product: NVIDIA-H20 (2 of 3 nodes crashing) vs Ada (2 nodes, none crashing)",)
    assert s.observed_hours == 24


@pytest.mark.parametrize("counts, nodes, says", [
    ([({**G, "forensics_figure": "pods", "forensics_value": "1"}, "2.5")], [], "not a whole number"),
    ([({**G, "forensics_figure": "pods", "forensics_value": "1"}, "-1")], [], "not a whole number"),
    ([({**G, "forensics_figure": "restarts", "forensics_value": "lots"}, "1")], [], "not an integer"),
    ([], [({**G, "restarted": "maybe"}, "1")], "not an integer"),
    ([], [({**G, "restarted": "1"}, "NaN")], "finite value"),
])
def test_a_count_values_answer_that_lies_is_one_clear_error(counts, nodes, says):
    with FakePrometheus(_fleet_answer(counts, nodes)) as server, pytest.raises(PrometheusError) as e:
        summarize_fleet_prometheus(PromClient(server.url))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_bad_selector_is_refused_before_prometheus_is_asked():
    with FakePrometheus(_fleet_answer([], [])) as server:
        with pytest.raises(SelectorError):
            summarize_fleet_prometheus(PromClient(server.url), selector="app>1")
        assert server.seen == []
