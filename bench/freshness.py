"""Freshness: time from the start of an export (after a training step) to `sparta serve`
answering /v1/model with that version. `sparta train --follow` exports every 10 steps while
three 200k-row files are shipped into its directory; `sparta serve --poll-ms 100` follows.

usage: python3 bench/freshness.py WORKDIR   (SPARTA=path/to/release/sparta, default target/release/sparta)
"""
import os, sys, subprocess, time, json, urllib.request, shutil, threading, statistics, re
S=os.path.abspath(os.environ.get('SPARTA','target/release/sparta'))
D=os.path.abspath(sys.argv[1]); os.makedirs(D, exist_ok=True)
for i in range(3):
    if not os.path.exists(f'{D}/src{i}.tsv'):
        subprocess.run([S,'gen-data','--rows','200000','--seed',str(i+1),'--out',f'{D}/src{i}.tsv'],check=True,capture_output=True)
inp=f'{D}/in'; exp=f'{D}/exp'; stop=f'{D}/stop'
for p in (inp, exp):
    shutil.rmtree(p, ignore_errors=True); os.makedirs(p)
if os.path.exists(stop): os.remove(stop)
shutil.copy(f'{D}/src0.tsv', f'{inp}/.a.tmp'); os.rename(f'{inp}/.a.tmp', f'{inp}/a.tsv')
tr=subprocess.Popen([S,'train','--follow',inp,'--stop-file',stop,'--export-dir',exp,'--export-every-steps','10','--quiet','--follow-poll-secs','0.2'],stdout=subprocess.DEVNULL,stderr=open(f'{D}/train.log','w'))
while not any(n.startswith('v') and os.path.exists(f'{exp}/{n}/MANIFEST') or n.startswith('v') for n in os.listdir(exp)): time.sleep(0.01)
time.sleep(2)
sv=subprocess.Popen([S,'serve','--model',exp,'--listen','127.0.0.1:18099','--poll-ms','100'],stdout=subprocess.PIPE,stderr=open(f'{D}/serve.log','w'),text=True)
time.sleep(1.5)
seen={}  # version -> first time dir seen
served={}
done=False
def watch_dirs():
    while not done:
        for n in os.listdir(exp):
            m=re.match(r'v0*(\d+)$', n)
            if m and int(m.group(1)) not in seen: seen[int(m.group(1))]=time.time()
        time.sleep(0.002)
th=threading.Thread(target=watch_dirs); th.start()
def ship(i,name):
    shutil.copy(f'{D}/src{i}.tsv', f'{inp}/.{name}.tmp'); os.rename(f'{inp}/.{name}.tmp', f'{inp}/{name}.tsv')
t_end=time.time()+40
shipped=1
while time.time()<t_end:
    try:
        v=json.load(urllib.request.urlopen('http://127.0.0.1:18099/v1/model',timeout=2))['version']
        if v not in served: served[v]=time.time()
    except Exception as e:
        pass
    if time.time()>t_end-30+10*shipped and shipped<3:
        ship(shipped, 'abc'[shipped]); shipped+=1
    time.sleep(0.005)
open(stop,'w').close()
tr.wait(timeout=120); done=True; th.join()
sv.kill()
lat=[served[v]-seen[v] for v in served if v in seen and v>min(served)]
print('versions exported', len(seen), 'served', len(served), 'measured', len(lat))
lat.sort()
if lat:
    print('freshness ms: min %.0f p50 %.0f p90 %.0f max %.0f' % (lat[0]*1e3, statistics.median(lat)*1e3, lat[int(0.9*(len(lat)-1))]*1e3, lat[-1]*1e3))
print(open(f'{D}/train.log').read()[-600:])
