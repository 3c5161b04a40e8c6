import { describe, expect, it } from 'vitest';

import { terminalTarget } from '../src/model';
import { closedNotice, encodeMessage, parseMessage, terminalUrl } from '../src/terminal';

const kernel = (id: string) =>
  ({ id, name: 'sandbox-default', execution_state: 'idle', backend: 'local', sandbox: {} }) as any;

describe('terminalTarget', () => {
  const two = [kernel('a'), kernel('b')];
  it.each([
    ['the requested kernel', 'b', 'a', two, { kind: 'kernel', id: 'b' }],
    ['the focused kernel', null, 'a', two, { kind: 'kernel', id: 'a' }],
    ['the focused kernel when the requested one is gone', 'x', 'a', two, { kind: 'kernel', id: 'a' }],
    ['the only sandboxed kernel', null, 'plain', [kernel('a')], { kind: 'kernel', id: 'a' }],
    ['a choice among several', null, 'plain', two, { kind: 'choose', ids: ['a', 'b'] }],
    ['none', null, null, [], { kind: 'none' }]
  ])('%s', (_, requested, focused, kernels, expected) => {
    expect(terminalTarget(requested as any, focused as any, kernels as any)).toEqual(expected);
  });
});

describe('terminal messages', () => {
  it.each([
    ['["stdout", "hi\\r\\n"]', { type: 'stdout', content: ['hi\r\n'] }],
    ['["disconnect", 1]', { type: 'disconnect', content: [] }],
    ['["setup", {}]', null],
    ['["stdout", 5]', null],
    ['{"stdout": "x"}', null],
    ['not json', null],
    ['[]', null]
  ])('%s', (data, expected) => {
    expect(parseMessage(data)).toEqual(expected);
  });

  it('refuses binary frames', () => {
    expect(parseMessage(new ArrayBuffer(4))).toBeNull();
  });

  it('encodes what the widget sends as terminado arrays', () => {
    expect(encodeMessage({ type: 'stdin', content: ['ls\r'] })).toBe('["stdin","ls\\r"]');
    expect(encodeMessage({ type: 'set_size', content: [24, 80, 400, 600] })).toBe(
      '["set_size",24,80,400,600]'
    );
  });

  it('says why a connection closed, unless the shell ended', () => {
    expect(closedNotice(false, false)).toContain('could not be opened');
    expect(closedNotice(true, false)).toContain('Open a new Sandbox Terminal');
    expect(closedNotice(true, true)).toBe('');
  });

  it('adds the token only when the server wants it in the URL', () => {
    const settings = { wsUrl: 'ws://h/base/', token: 't k', appendToken: true } as any;
    expect(terminalUrl(settings, 'k-1')).toBe('ws://h/base/api/sandbox/kernels/k-1/terminal?token=t%20k');
    expect(terminalUrl({ ...settings, appendToken: false }, 'k-1')).toBe(
      'ws://h/base/api/sandbox/kernels/k-1/terminal'
    );
  });
});
