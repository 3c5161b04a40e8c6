import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import {
  backoffDelay,
  EMPTY_SNAPSHOT,
  EventStreamParser,
  IKernelEntry,
  ISnapshot
} from './model';

/** Call `/api/sandbox/<path>` with the server's authentication. */
export async function requestAPI<T>(
  path: string,
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'api/sandbox', path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  let data: any = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { message: text };
    }
  }
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, data?.message || response.statusText);
  }
  return data as T;
}

/** Suspend a kernel's sandbox; a busy kernel is refused (409) unless `force`. */
export function suspendKernel(kernelId: string, force = false): Promise<IKernelEntry> {
  return requestAPI<IKernelEntry>(`kernels/${encodeURIComponent(kernelId)}/suspend`, {
    method: 'POST',
    body: JSON.stringify(force ? { force: true } : {})
  });
}

/** The server refused to suspend a kernel that is running a cell. */
export function isKernelBusy(err: unknown): boolean {
  return err instanceof ServerConnection.ResponseError && err.response.status === 409;
}

export function resumeKernel(kernelId: string): Promise<IKernelEntry> {
  return requestAPI<IKernelEntry>(`kernels/${encodeURIComponent(kernelId)}/resume`, {
    method: 'POST'
  });
}

/** Copy mode: bring what the kernel created or changed back to the notebook's directory. */
export function copyFilesBack(kernelId: string): Promise<IKernelEntry> {
  return requestAPI<IKernelEntry>(`kernels/${encodeURIComponent(kernelId)}/copy-back`, {
    method: 'POST'
  });
}

/** What the kernel's sandbox uses now (the runtime only: cheap enough to poll). */
export function kernelUsage(kernelId: string): Promise<IKernelEntry> {
  return requestAPI<IKernelEntry>(`kernels/${encodeURIComponent(kernelId)}?usage=true`);
}

export function kernelDetails(kernelId: string): Promise<IKernelEntry> {
  return requestAPI<IKernelEntry>(`kernels/${encodeURIComponent(kernelId)}?fresh=true`);
}

/**
 * The server's live view of sandboxes: one `GET /api/sandbox/events` stream,
 * reconnected with backoff when it drops. No polling.
 */
export class SandboxEvents {
  constructor(settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {
    this._settings = settings;
    void this._run();
  }

  get snapshot(): ISnapshot {
    return this._snapshot;
  }

  get connected(): boolean {
    return this._connected;
  }

  get changed(): ISignal<this, ISnapshot> {
    return this._changed;
  }

  /** Adopt an answer of an action at once, before the stream confirms it. */
  updateKernel(entry: IKernelEntry): void {
    const kernels = this._snapshot.kernels.map(k => (k.id === entry.id ? entry : k));
    this._snapshot = { ...this._snapshot, kernels };
    this._changed.emit(this._snapshot);
  }

  kernel(kernelId: string | undefined | null): IKernelEntry | undefined {
    return kernelId ? this._snapshot.kernels.find(k => k.id === kernelId) : undefined;
  }

  dispose(): void {
    this._disposed = true;
    this._abort?.abort();
    Signal.clearData(this);
  }

  private async _run(): Promise<void> {
    let attempt = 0;
    while (!this._disposed) {
      this._abort = new AbortController();
      try {
        await this._stream(this._abort.signal, () => {
          attempt = 0;
        });
      } catch (err) {
        if (this._disposed) {
          return;
        }
        console.debug('jupyter-sandbox: event stream dropped', err);
      }
      this._setConnected(false);
      const delay = backoffDelay(attempt++);
      await new Promise(resolve => setTimeout(resolve, delay));
    }
  }

  private async _stream(signal: AbortSignal, onOpen: () => void): Promise<void> {
    const url = URLExt.join(this._settings.baseUrl, 'api/sandbox/events');
    const response = await ServerConnection.makeRequest(
      url,
      { signal, headers: { Accept: 'text/event-stream' } },
      this._settings
    );
    if (!response.ok || !response.body) {
      throw new Error(`events: HTTP ${response.status}`);
    }
    this._setConnected(true);
    onOpen();
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const parser = new EventStreamParser();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        return;
      }
      for (const event of parser.feed(decoder.decode(value, { stream: true }))) {
        if (event.event === 'snapshot') {
          try {
            this._snapshot = { ...EMPTY_SNAPSHOT, ...JSON.parse(event.data) };
          } catch (err) {
            console.warn('jupyter-sandbox: bad snapshot', err);
            continue;
          }
          this._changed.emit(this._snapshot);
        }
      }
    }
  }

  private _setConnected(value: boolean): void {
    if (this._connected !== value) {
      this._connected = value;
      this._changed.emit(this._snapshot);
    }
  }

  private _settings: ServerConnection.ISettings;
  private _snapshot: ISnapshot = EMPTY_SNAPSHOT;
  private _connected = false;
  private _disposed = false;
  private _abort: AbortController | null = null;
  private _changed = new Signal<this, ISnapshot>(this);
}
