"""``Sandbox.kernel()``: a jupyter_client KernelClient on the sandbox's kernel."""

from __future__ import annotations

from typing import Any

from jupyter_sandbox.client import Sandbox


def run_code(kc: Any, code: str) -> tuple[str, dict[str, Any]]:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=60, output_hook=hook)
    return "".join(out), reply["content"]


def test_kernel_executes_code_in_the_workspace(sandbox: Sandbox) -> None:
    sandbox.files.write("from-files.txt", "written through files.write")
    kc = sandbox.kernel()
    out, reply = run_code(kc, "x = 6 * 7\nprint(x)")
    assert reply["status"] == "ok" and out == "42\n"
    out, _ = run_code(kc, "print(open('from-files.txt').read())")
    assert out == "written through files.write\n"
    run_code(kc, "open('from-kernel.txt', 'w').write('hi from the kernel')")
    assert sandbox.files.read("from-kernel.txt") == b"hi from the kernel"

    # A second client shares the same kernel (and its state).
    kc2 = sandbox.kernel()
    out, _ = run_code(kc2, "print(x + 1)")
    assert out == "43\n"
    _, reply = run_code(kc2, "1/0")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert kc.kernel_info()  # msg id: the shell channel still works
