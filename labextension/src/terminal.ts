/**
 * The Sandbox Terminal: JupyterLab's own terminal widget, connected to a shell
 * inside a sandboxed kernel's sandbox (``/api/sandbox/kernels/<id>/terminal``,
 * terminado's messages) instead of a shell on the server.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection, Terminal as TerminalAPI } from '@jupyterlab/services';
import { JSONPrimitive } from '@lumino/coreutils';
import { ISignal, Signal } from '@lumino/signaling';

/** The WebSocket address of a kernel's sandbox terminal (with the token when the server wants it). */
export function terminalUrl(settings: ServerConnection.ISettings, kernelId: string): string {
  let url = URLExt.join(settings.wsUrl, 'api/sandbox/kernels', encodeURIComponent(kernelId), 'terminal');
  if (settings.appendToken && settings.token) {
    url += `?token=${encodeURIComponent(settings.token)}`;
  }
  return url;
}

/** A terminado message from the server as the widget takes it; null for anything else. */
export function parseMessage(data: unknown): TerminalAPI.IMessage | null {
  if (typeof data !== 'string') {
    return null;
  }
  let value: unknown;
  try {
    value = JSON.parse(data);
  } catch {
    return null;
  }
  if (!Array.isArray(value) || typeof value[0] !== 'string') {
    return null;
  }
  const [type, ...rest] = value;
  if (type === 'stdout' && typeof rest[0] === 'string') {
    return { type: 'stdout', content: [rest[0]] };
  }
  if (type === 'disconnect') {
    return { type: 'disconnect', content: [] };
  }
  return null; // 'setup' and anything unknown: nothing for the widget
}

/** What the terminal shows when its connection closes ('' when the shell said it ended). */
export function closedNotice(wasOpen: boolean, shellEnded: boolean): string {
  if (!wasOpen) {
    return (
      '\r\n[The sandbox terminal could not be opened: the kernel may have been shut down, ' +
      'or its sandbox has as many terminals open as it may. The server log says why.]\r\n'
    );
  }
  if (!shellEnded) {
    return (
      '\r\n[The connection to the sandbox closed: it was suspended, or its kernel was shut ' +
      'down. Open a new Sandbox Terminal to go on.]\r\n'
    );
  }
  return '';
}

/** The widget's message as terminado's array. */
export function encodeMessage(message: TerminalAPI.IMessage): string {
  return JSON.stringify([message.type, ...((message.content ?? []) as JSONPrimitive[])]);
}

/**
 * One shell in a sandbox, for one terminal widget. The shell lives as long as
 * the connection: closing it (or the widget) hangs the shell up; ``reconnect``
 * opens a new one.
 */
export class SandboxTerminalConnection implements TerminalAPI.ITerminalConnection {
  constructor(
    readonly kernelId: string,
    readonly name: string,
    readonly serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {
    this._open();
  }

  get model(): TerminalAPI.IModel {
    return { name: this.name };
  }
  get messageReceived(): ISignal<this, TerminalAPI.IMessage> {
    return this._messageReceived;
  }
  get connectionStatus(): TerminalAPI.ConnectionStatus {
    return this._status;
  }
  get connectionStatusChanged(): ISignal<this, TerminalAPI.ConnectionStatus> {
    return this._statusChanged;
  }
  get disposed(): ISignal<this, void> {
    return this._disposed;
  }
  get isDisposed(): boolean {
    return this._isDisposed;
  }

  send(message: TerminalAPI.IMessage): void {
    if (this._ws && this._ws.readyState === WebSocket.OPEN) {
      this._ws.send(encodeMessage(message));
    }
  }

  async reconnect(): Promise<void> {
    this._close();
    this._finished = false;
    this._open();
  }

  async shutdown(): Promise<void> {
    this.dispose();
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._close();
    this._disposed.emit();
    Signal.clearData(this);
  }

  private _open(): void {
    const ws = new this.serverSettings.WebSocket(terminalUrl(this.serverSettings, this.kernelId));
    this._ws = ws;
    this._setStatus('connecting');
    ws.onopen = () => {
      if (ws === this._ws) {
        this._setStatus('connected');
      }
    };
    ws.onmessage = (event: MessageEvent) => {
      const message = ws === this._ws ? parseMessage(event.data) : null;
      if (message) {
        this._finished = this._finished || message.type === 'disconnect';
        this._messageReceived.emit(message);
      }
    };
    ws.onclose = (event: CloseEvent) => {
      if (ws !== this._ws) {
        return;
      }
      this._ws = null;
      const notice = closedNotice(this._status === 'connected', this._finished);
      if (notice) {
        this._messageReceived.emit({ type: 'stdout', content: [notice] });
      }
      this._setStatus('disconnected');
    };
  }

  private _close(): void {
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      ws.close();
    }
    this._setStatus('disconnected');
  }

  private _setStatus(status: TerminalAPI.ConnectionStatus): void {
    if (status !== this._status) {
      this._status = status;
      this._statusChanged.emit(status);
    }
  }

  private _ws: WebSocket | null = null;
  private _finished = false;
  private _status: TerminalAPI.ConnectionStatus = 'connecting';
  private _isDisposed = false;
  private _messageReceived = new Signal<this, TerminalAPI.IMessage>(this);
  private _statusChanged = new Signal<this, TerminalAPI.ConnectionStatus>(this);
  private _disposed = new Signal<this, void>(this);
}
