"""Which tokens could VisionZip keep? Answers of the demo model (transformers, f32, greedy) on single-image
held-out items when each image keeps floor(M * (1 - rate)) of its M merged tokens chosen by:
attention received at vision block 0..3 (`b0`..`b3`, VisionZip's score, as zest computes it), the pixel
contrast of the token's 32x32 area (`ink`, an oracle that knows where the text is), or at random; with --adaptive also per-image budgets from the last block's scores: the fewest tokens that hold a share
T of the image's attention mass (`mT`), or every token scoring at least X times the image's mean (`rX`), each
reported with the share of tokens it kept.
The pruned prompt keeps the kept tokens' embeddings, DeepStack rows and unpruned M-RoPE positions
(as zest and tools/make_accel_fixtures.py do).

    python3 tools/demo_model/prune_oracle.py --model models/zest-demo-vl --data /tmp/demo-eval/eval.jsonl \
        --tasks reading,tables,charts --per-task 40 --rate 0.4
"""
import argparse
import json, math, os

import numpy as np
import torch
from PIL import Image
from transformers import AutoProcessor, Qwen3VLMoeForConditionalGeneration, DynamicCache
from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as mm
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="models/zest-demo-vl")
ap.add_argument("--data", required=True)
ap.add_argument("--tasks", default="reading,tables,charts")
ap.add_argument("--per-task", type=int, default=40)
ap.add_argument("--rate", type=float, default=0.4)
ap.add_argument("--adaptive", action="store_true", help="also the mass and relative-score budgets (mT, rX)")
a = ap.parse_args()
M = a.model
D = os.path.dirname(os.path.abspath(a.data))
model=Qwen3VLMoeForConditionalGeneration.from_pretrained(M, dtype=torch.float32).eval()
proc=AutoProcessor.from_pretrained(M)
vis=model.model.visual
caps={}
def mk(i):
    def hook(mod,args,kw): caps[i]=(args,kw)
    return hook
for i,b in enumerate(vis.blocks): b.attn.register_forward_pre_hook(mk(i), with_kwargs=True)
IMG=proc.tokenizer.convert_tokens_to_ids('<|image_pad|>')
def block_scores(i):
    args,kw=caps[i]; h=args[0] if args else kw['hidden_states']; a=vis.blocks[i].attn; n=h.shape[0]
    qkv=a.qkv(h).reshape(n,3,a.num_heads,-1).permute(1,0,2,3); q,k=qkv[0],qkv[1]
    q,k=mm.apply_rotary_pos_emb_vision(q,k,*kw['position_embeddings'])
    p=(torch.einsum('ihd,jhd->hij',q,k)*a.scaling).softmax(-1)
    return p.sum(1).mean(0).detach().reshape(-1,4).sum(1).numpy()
def lm_forward(embeds,pos3,vmask,ds,cache=None):
    out=model.model.language_model(input_ids=None,inputs_embeds=embeds[None],position_ids=torch.as_tensor(pos3)[:,None,:],
        visual_pos_masks=None if vmask is None else vmask[None],deepstack_visual_embeds=ds,past_key_values=cache,use_cache=cache is not None)
    return model.lm_head(out.last_hidden_state)[0]
def run(ids,full_pos,emb,ds,kept):
    ipos=(ids==IMG).nonzero()[:,0]; drop=torch.ones(len(ipos),dtype=torch.bool); drop[kept]=False
    keep=torch.ones(len(ids),dtype=torch.bool); keep[ipos[drop]]=False
    pid=ids[keep]; pos=full_pos[:,keep]; n=len(pid); delta=int(pos.max())+1-n; v=pid==IMG
    e=model.model.language_model.embed_tokens(pid).clone(); e[v]=emb[kept]
    cache=DynamicCache(config=model.config.get_text_config())
    lg=lm_forward(e,pos,v,[d[kept] for d in ds],cache)[-1]; toks=[]
    for i in range(16):
        t=int(lg.argmax()); toks.append(t)
        if t in (proc.tokenizer.convert_tokens_to_ids('<|im_end|>'),): break
        p=torch.full((3,1),n+i+delta,dtype=torch.long)
        lg=lm_forward(model.model.language_model.embed_tokens(torch.tensor([t])),p,None,None,cache)[-1]
    return proc.decode(toks,skip_special_tokens=True).strip()
items=[json.loads(l) for l in open(a.data)]
tasks=a.tasks.split(','); per=a.per_task; rate=a.rate
strategies=['none','b0','b1','b2','b3','ink','random']
if a.adaptive: strategies+=['m0.5','m0.6','m0.7','m0.8','r0.5','r0.75','r1.0']
res={t:{s:0 for s in strategies} for t in tasks}; cnt={t:0 for t in tasks}
frac={t:{s:0.0 for s in strategies} for t in tasks}
rng=np.random.default_rng(0)
for it in items:
    t=it['task']
    if t not in tasks or cnt[t]>=per: continue
    urls=[p['image_url']['url'] for p in it['messages'][0]['content'] if p['type']=='image_url']
    if len(urls)!=1: continue
    cnt[t]+=1
    img=Image.open(os.path.join(D,urls[0])).convert('RGB')
    msgs=[{'role':'user','content':[{'type':'image'} if p['type']=='image_url' else p for p in it['messages'][0]['content']]}]
    text=proc.apply_chat_template(msgs,tokenize=False,add_generation_prompt=True)
    inp=proc(text=[text],images=[img],return_tensors='pt')
    with torch.no_grad():
        fo=model.model.get_image_features(inp['pixel_values'],inp['image_grid_thw'],return_dict=True)
        emb=fo.pooler_output; emb=torch.cat(emb) if isinstance(emb,(list,tuple)) else emb
        ds=fo.deepstack_features
        sc={f'b{i}':block_scores(i) for i in range(len(vis.blocks))}
        kw={k:inp[k] for k in ('mm_token_type_ids',) if k in inp}
        full_pos,_=model.model.get_rope_index(inp['input_ids'],image_grid_thw=inp['image_grid_thw'],**kw)
        full_pos=full_pos[:,0]
    Mtok=emb.shape[0]; k=max(min(Mtok,16),math.floor(Mtok*(1-rate)))
    thw=inp['image_grid_thw'][0].tolist(); mh,mw=thw[1]//2,thw[2]//2
    g=np.asarray(img.resize((thw[2]*16,thw[1]*16)).convert('L'),dtype=np.float32)
    ink=np.array([g[r*32:(r+1)*32,c*32:(c+1)*32].std() for r in range(mh) for c in range(mw)])
    sc['ink']=ink; sc['random']=rng.random(Mtok)
    ans=it['answer'] if isinstance(it['answer'],list) else [it['answer']]
    last=sc[f'b{len(vis.blocks)-1}']; order=np.argsort(-last,kind='stable'); mass=np.cumsum(last[order])/last.sum()
    for s in strategies:
        if s=='none': kept=torch.arange(Mtok)
        elif s[0] in 'mr' and s[1].isdigit():
            kk=int(np.searchsorted(mass,float(s[1:])-1e-12))+1 if s[0]=='m' else int((last>=float(s[1:])*last.mean()).sum())
            kept=torch.tensor(sorted(order[:max(min(Mtok,16),kk)].tolist()))
        else: kept=torch.tensor(sorted(np.argsort(-sc[s],kind='stable')[:k].tolist()))
        frac[t][s]+=len(kept)/Mtok
        with torch.no_grad(): pred=run(inp['input_ids'][0],full_pos,emb,ds,kept)
        res[t][s]+= any(pred.lower()==a.lower() for a in ans)
print('| task | items | ' + ' | '.join(strategies) + ' |')
print('|---|---:|' + '---:|' * len(strategies))
for t in tasks:
    print(f'| {t} | {cnt[t]} | ' + ' | '.join(f'{100 * res[t][s] / max(cnt[t], 1):.0f}' for s in strategies) + ' |')
print('\nShare of tokens kept, %:\n')
print('| task | ' + ' | '.join(strategies) + ' |')
print('|---|' + '---:|' * len(strategies))
for t in tasks:
    print(f'| {t} | ' + ' | '.join(f'{100 * frac[t][s] / max(cnt[t], 1):.0f}' for s in strategies) + ' |')
