import { URLExt } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { FileBrowser, FilterFileBrowserModel, Uploader } from '@jupyterlab/filebrowser';
import { Contents, ServerConnection } from '@jupyterlab/services';
import { LabIcon, refreshIcon, ToolbarButton } from '@jupyterlab/ui-components';
import type { Message } from '@lumino/messaging';
import { ISignal, Signal } from '@lumino/signaling';
import { Panel, Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { ISandboxDescription, workspaceHeader } from './model';

import sandboxFilesSvgStr from '../style/icons/sandbox-files.svg';

export const sandboxFilesIcon = new LabIcon({
  name: 'jupyter-sandbox:sandbox-files',
  svgstr: sandboxFilesSvgStr
});

export const DRIVE_NAME = 'Sandbox';

/** A workspace path as the server's URL wants it: each component encoded. */
function encodePath(path: string): string {
  return path
    .split('/')
    .filter(part => part)
    .map(encodeURIComponent)
    .join('/');
}

/**
 * The workspace of the sandbox of the notebook or console in focus, as a drive:
 * JupyterLab's file browser and viewers open, download and upload through it
 * (`/api/sandbox/kernels/<id>/contents`). The runtime's file API has no delete,
 * rename or mkdir, so neither has the drive: the kernel makes files, the user
 * uploads them.
 */
export class SandboxDrive implements Contents.IDrive {
  constructor(
    readonly serverSettings: ServerConnection.ISettings,
    private _kernelId: () => string | null
  ) {}

  readonly name = DRIVE_NAME;

  get fileChanged(): ISignal<this, Contents.IChangedArgs> {
    return this._fileChanged;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    this._isDisposed = true;
    Signal.clearData(this);
  }

  async get(localPath: string, options?: Contents.IFetchOptions): Promise<Contents.IModel> {
    const kernelId = this._kernelId();
    if (!kernelId) {
      return emptyDirectory(localPath);
    }
    const query = new URLSearchParams();
    if (options?.content === false) {
      query.set('content', '0');
    }
    if (options?.format) {
      query.set('format', options.format);
    }
    const suffix = query.toString() ? `?${query}` : '';
    return requestAPI<Contents.IModel>(
      `kernels/${kernelId}/contents/${encodePath(localPath)}${suffix}`,
      {},
      this.serverSettings
    );
  }

  async getDownloadUrl(localPath: string): Promise<string> {
    const kernelId = this._kernelId();
    if (!kernelId) {
      throw new Error('No sandboxed notebook or console is in focus');
    }
    return URLExt.join(
      this.serverSettings.baseUrl,
      'api/sandbox/kernels',
      kernelId,
      'download',
      encodePath(localPath)
    );
  }

  async save(
    localPath: string,
    options: Partial<Contents.IModel> & { chunk?: number } = {}
  ): Promise<Contents.IModel> {
    const kernelId = this._kernelId();
    if (!kernelId) {
      throw new Error('No sandboxed notebook or console is in focus');
    }
    const body: Record<string, unknown> = {
      type: options.type ?? 'file',
      format: options.format ?? 'text',
      content:
        options.format === 'json' ? JSON.stringify(options.content) : (options.content ?? '')
    };
    if (options.format === 'json') {
      body.format = 'text';
    }
    if (options.chunk !== undefined) {
      body.chunk = options.chunk;
    }
    const model = await requestAPI<Contents.IModel>(
      `kernels/${kernelId}/contents/${encodePath(localPath)}`,
      { method: 'PUT', body: JSON.stringify(body) },
      this.serverSettings
    );
    this._fileChanged.emit({ type: 'save', oldValue: null, newValue: model });
    return model;
  }

  async newUntitled(): Promise<Contents.IModel> {
    throw new Error(
      "The sandbox's workspace gets new files from its kernel, or by upload: " +
        'folders and untitled files cannot be made here'
    );
  }

  async delete(): Promise<void> {
    throw new Error("Files in the sandbox's workspace are deleted by its kernel (os.remove)");
  }

  async rename(): Promise<Contents.IModel> {
    throw new Error("Files in the sandbox's workspace are renamed by its kernel (os.rename)");
  }

  async copy(): Promise<Contents.IModel> {
    throw new Error("Files in the sandbox's workspace are copied by its kernel (shutil.copy)");
  }

  // No checkpoints in a sandbox: saving a file writes it.
  async createCheckpoint(): Promise<Contents.ICheckpointModel> {
    return { id: 'sandbox', last_modified: new Date().toISOString() };
  }

  async listCheckpoints(): Promise<Contents.ICheckpointModel[]> {
    return [];
  }

  async restoreCheckpoint(): Promise<void> {
    return;
  }

  async deleteCheckpoint(): Promise<void> {
    return;
  }

  private _fileChanged = new Signal<this, Contents.IChangedArgs>(this);
  private _isDisposed = false;
}

function emptyDirectory(path: string): Contents.IModel {
  return {
    name: '',
    path,
    type: 'directory',
    created: '',
    last_modified: '',
    mimetype: '',
    format: 'json',
    content: [],
    writable: false
  };
}

/**
 * The left-area panel: which sandbox it shows, and JupyterLab's own file browser
 * on the drive, with an upload button.
 */
export class WorkspacePanel extends Panel {
  constructor(manager: IDocumentManager) {
    super();
    this.id = 'jupyter-sandbox-workspace';
    this.addClass('jp-SandboxWorkspace');
    this.title.icon = sandboxFilesIcon;
    this.title.caption = "Sandbox Files: the workspace of the focused notebook's sandbox";
    this._header.addClass('jp-SandboxWorkspace-header');
    // Not made by the file browser factory: its tracker would make this browser the
    // "current" one, and the launcher would then create new notebooks in the sandbox.
    this.browser = new FileBrowser({
      id: 'jupyter-sandbox-files',
      model: new FilterFileBrowserModel({
        manager,
        driveName: DRIVE_NAME,
        refreshInterval: 10000,
        // Each refresh asks the sandbox: only while this panel shows a sandbox's
        // files (and the page is visible), never for a panel nobody looks at.
        refreshStandby: () => (this.isVisible && this._kernelId ? 'when-hidden' : true)
      })
    });
    this.browser.toolbar.addItem(
      'upload',
      new Uploader({ model: this.browser.model })
    );
    this.browser.toolbar.addItem(
      'refresh',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Refresh the sandbox files',
        onClick: () => void this.browser.model.refresh()
      })
    );
    this.addWidget(this._header);
    this.addWidget(this.browser);
    this.showSandbox(null);
  }

  readonly browser: FileBrowser;

  /** The kernel whose sandbox is shown; the drive reads and writes there. */
  get kernelId(): string | null {
    return this._kernelId;
  }

  /** Show the workspace of this kernel's sandbox (null: none in focus). */
  showSandbox(
    label: string | null,
    kernelId: string | null = null,
    sandbox?: ISandboxDescription
  ): void {
    this._header.node.textContent = workspaceHeader(label, sandbox);
    this.browser.node.style.display = label ? '' : 'none';
    if (kernelId !== this._kernelId) {
      this._kernelId = kernelId;
      this._stale = true; // another sandbox: from its top, when the panel is shown
      if (this.isVisible) {
        this._reload();
      }
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (this._stale) {
      this._reload();
    } else if (this._kernelId) {
      void this.browser.model.refresh(); // it did not poll while hidden
    }
  }

  private _reload(): void {
    this._stale = false;
    void this.browser.model.cd('/').then(() => this.browser.model.refresh());
  }

  private _header = new Widget();
  private _kernelId: string | null = null;
  private _stale = false;
}
